"""Thresholds of the diagnosis (phases and insights): ONE config, every default sourced.

Override any field in the Pharos settings file (``pharos.toml``, or the file named by
``PHAROS_CONFIG``) under a ``[diagnosis]`` table, or with an environment variable
``PHAROS_DIAGNOSIS_<FIELD>`` (e.g. ``PHAROS_DIAGNOSIS_SMALL_REQUESTS_ABSOLUTE=100``).
Precedence: explicit arguments, environment, file, defaults.

Sources of the defaults:

* **Drishti** (Bez et al., "Drishti: Guiding End-Users in the I/O Optimization Journey",
  PDSW'22; hpc-io/drishti-io ``drishti/includes/config.py`` ``thresholds``):
  ``small_bytes`` 1 MiB, ``small_requests`` 0.1, ``small_requests_absolute`` 1000,
  ``misaligned_requests`` 0.1, ``metadata_time_rank`` 30 s, ``random_operations`` 0.2,
  ``random_operations_absolute`` 1000, ``imbalance_stragglers`` 0.15, ``imbalance_size``
  0.3, ``interface_stdio`` 0.1, ``imbalance_operations`` 0.1.
* **Beacon** (Yang et al., NSDI'19): a job is metadata-heavy above 1,000 metadata
  operations per second.
* **Significance** (Drishti's share and absolute thresholds, applied to every rule):
  ``significance_share`` 0.1 (Drishti's small_requests / misaligned_requests / interface_stdio
  shares), ``significance_min_requests`` 1000 (Drishti small_requests_absolute /
  random_operations_absolute).
* **TOKIO** (Total Knowledge of I/O, NERSC/LBNL; pytokio ``tokio/cli/darshan_bad_ost.py``): straggler attribution correlates per-file performance
  with each OST; ``straggler_p_value`` 0.05 (its ``--p-threshold``), ``straggler_correlation``
  0.5 (its ``--c-warning``, "this OST looks unhealthy"); ``straggler_min_ratio`` 2.0 is
  Beacon §5.3's 0.5 bandwidth ratio.
* **Beacon §5.3** (slow node detection): ``failslow_bw_ratio`` 0.5, ``failslow_volume_ratio``
  0.6, ``failslow_windows_s`` 1 h, 4 h, 12 h, 96 h.
* **Pharos**: the rest (phase gap, sustain window, file/fsync/stripe thresholds, the fail-slow
  model, interference, alerting), chosen here and marked so in the field descriptions.
"""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from pharos_core.settings import PharosSettings

MiB = 1 << 20


class DiagnosisConfig(PharosSettings):
    """Every threshold of :mod:`pharos_analytics.phases`, :mod:`pharos_analytics.insights` and the
    system-side diagnosis (:mod:`~pharos_analytics.failslow`, :mod:`~pharos_analytics.interference`,
    :mod:`~pharos_analytics.alerts`)."""

    model_config = SettingsConfigDict(env_prefix="PHAROS_DIAGNOSIS_", extra="ignore")
    toml_table = "diagnosis"

    # -- phases (Pharos) --------------------------------------------------------------
    phase_gap_s: float = Field(
        default=1.0, gt=0, description="Pharos. Idle time (s) without any request of the job that ends a phase."
    )
    max_phases: int = Field(
        default=64,
        ge=1,
        description="Pharos. At most this many phases: if more gaps exceed phase_gap_s, only the "
        "max_phases-1 longest gaps split the job (the gap threshold rises).",
    )
    # -- request size (Drishti small_bytes / small_requests / small_requests_absolute) --------
    small_request_bytes: int = Field(
        default=MiB, ge=1, description="Drishti small_bytes. A request under this many bytes is small."
    )
    small_requests_ratio: float = Field(
        default=0.1,
        ge=0,
        le=1,
        description="Drishti small_requests. Share (0-1) of a direction's requests that are small.",
    )
    small_requests_absolute: int = Field(
        default=1000,
        ge=0,
        description="Drishti small_requests_absolute. Small requests (count) above which the insight is high severity.",
    )
    # -- alignment (Drishti misaligned_requests) -----------------------------------------
    alignment_bytes: int = Field(
        default=4096, ge=1, description="Pharos. Alignment (bytes) a request offset is checked against (page size)."
    )
    misaligned_ratio: float = Field(
        default=0.1,
        ge=0,
        le=1,
        description="Drishti misaligned_requests. Share (0-1) of data requests at a misaligned offset.",
    )
    # -- access order (Drishti random_operations / random_operations_absolute) ------------
    random_ratio: float = Field(
        default=0.2,
        ge=0,
        le=1,
        description="Drishti random_operations. Share (0-1) of requests that are not sequential.",
    )
    random_absolute: int = Field(
        default=1000,
        ge=0,
        description="Drishti random_operations_absolute. Random requests (count) needed for the insight.",
    )
    # -- imbalance (Drishti imbalance_stragglers / imbalance_size) -------------------------
    imbalance_stragglers: float = Field(
        default=0.15,
        ge=0,
        le=1,
        description="Drishti imbalance_stragglers. (slowest - fastest rank) / total, of bytes or time, on a shared file.",
    )
    imbalance_size: float = Field(
        default=0.3, ge=0, le=1, description="Drishti imbalance_size. (max - min) / max of the bytes moved per rank."
    )
    imbalance_min_ranks: int = Field(default=2, ge=2, description="Pharos. Ranks needed before imbalance is judged.")
    # -- metadata (Drishti metadata_time_rank; Beacon rate) --------------------------------
    metadata_time_rank_s: float = Field(
        default=30.0, ge=0, description="Drishti metadata_time_rank. Seconds one rank spends in metadata operations."
    )
    metadata_rate_ops_s: float = Field(
        default=1000.0,
        gt=0,
        description="Beacon (NSDI'19). Metadata operations per second that make I/O metadata-heavy.",
    )
    metadata_sustained_s: int = Field(
        default=3, ge=1, description="Pharos. Consecutive seconds above metadata_rate_ops_s that count as sustained."
    )
    # -- data direction (Drishti imbalance_operations) ------------------------------------
    dominance_ratio: float = Field(
        default=0.1,
        ge=0,
        le=1,
        description="Drishti imbalance_operations. |writes - reads| / all above which I/O is read- or write-dominant.",
    )
    # -- files, fsync, striping, redundancy (Pharos) ---------------------------------------
    many_files_absolute: int = Field(
        default=1000,
        ge=1,
        description="Pharos. Data files, each moving under small_file_bytes, that make 'many small files'.",
    )
    small_file_bytes: int = Field(default=MiB, ge=1, description="Pharos. A data file moving fewer bytes is small.")
    fsync_absolute: int = Field(
        default=100, ge=1, description="Pharos. fsync/fdatasync calls needed for an fsync storm."
    )
    fsync_per_write_ratio: float = Field(
        default=0.1, ge=0, description="Pharos. fsync/fdatasync calls per write request that make a storm."
    )
    shared_file_min_ranks: int = Field(
        default=16, ge=2, description="Pharos. Ranks sharing a file before a single storage target is a bottleneck."
    )
    redundant_min_bytes: int = Field(
        default=MiB,
        ge=0,
        description="Pharos. Bytes read more than once (or written then read) needed for the insight.",
    )
    interface_stdio_ratio: float = Field(
        default=0.1, ge=0, le=1, description="Drishti interface_stdio. Share (0-1) of the bytes moved through STDIO."
    )
    stdio_min_bytes: int = Field(
        default=MiB, ge=0, description="Pharos. Bytes through STDIO below which its share is not worth an insight."
    )
    # -- significance of every insight (Drishti thresholds, applied to bytes and time) ----------
    significance_share: float = Field(
        default=0.1,
        ge=0,
        le=1,
        description="Drishti small_requests / misaligned_requests / interface_stdio (0.1). An insight is "
        "high severity only when what it describes is at least this share (0-1) of the job's bytes or of "
        "its I/O time (summed over ranks; the slowest rank's I/O time for rank-time rules).",
    )
    significance_min_requests: int = Field(
        default=1000,
        ge=0,
        description="Drishti small_requests_absolute / random_operations_absolute (1000). A rule about "
        "requests (small, misaligned, random) is high severity only with at least this many of them.",
    )
    # -- straggler attribution (TOKIO darshan_bad_ost; Beacon §5.3 ratio) ------------------------
    straggler_p_value: float = Field(
        default=0.05,
        gt=0,
        le=1,
        description="TOKIO darshan_bad_ost --p-threshold (0.05). Largest p-value of the Pearson correlation "
        "of per-file log performance with a resource's indicator that counts.",
    )
    straggler_correlation: float = Field(
        default=0.5,
        gt=0,
        le=1,
        description="TOKIO darshan_bad_ost --c-warning (0.5). The correlation must be <= -this "
        "('this OST looks unhealthy').",
    )
    straggler_min_ratio: float = Field(
        default=2.0,
        gt=1,
        description="Beacon §5.3 (bandwidth < 0.5 x peers). The resource's median per-file performance must "
        "be at most 1/this of its peers' median (effect size).",
    )
    straggler_jobs_per_cycle: int = Field(
        default=8,
        ge=1,
        description="Pharos. Ended jobs the periodic detection attributes per cycle, oldest end first; "
        "more wait for the next cycles (after a start, the jobs of the last interference_lookback_s), so a "
        "cycle's cost is bounded by this many jobs' records, not by the backlog.",
    )
    straggler_min_files: int = Field(
        default=2,
        ge=2,
        description="Pharos. Files on the resource AND files on its peers needed to judge it: with one file "
        "per resource a slow file and a slow resource cannot be told apart.",
    )
    straggler_min_file_bytes: int = Field(
        default=64 * 1024,
        ge=0,
        description="Pharos. Files (observations) moving fewer bytes are left out of the attribution: the "
        "time of a few tiny requests is latency (locks, opens), not the resource's bandwidth.",
    )
    # -- bounds of the sequential (Python) analyses ----------------------------------------
    scan_max_records: int = Field(
        default=500_000,
        ge=1000,
        description="Pharos. Most records read into Python for read-after-write detection; the rest is not scanned (reported).",
    )

    # -- system-side diagnosis: fail-slow nodes (Beacon NSDI'19 §5.3; Pharos) ------------
    failslow_windows_s: list[float] = Field(
        default=[3600.0, 14400.0, 43200.0, 345600.0],
        min_length=1,
        description="Beacon §5.3 (1 h, 4 h, 12 h, 96 h). Widening look-back windows (s) of fail-slow "
        "detection: flagged in every window = persistent, in the shortest only = transient.",
    )
    failslow_min_intervals: int = Field(
        default=60,
        ge=2,
        description="Pharos. Intervals a fail-slow forwarder window is read in, at least: it reads the coarsest "
        "rollup of the forwarder layer (10 min, 1 min, 1 s; migration 014) that still cuts it into this many "
        "(1 h: 1 min; 12 h and 96 h: 10 min; under 1 h: 1 s), so a cycle reads (window / interval) x "
        "(forwarding node, target, job) rows, not seconds x those: 99 M rows per hour at 1,024 compute nodes.",
    )
    failslow_refresh_share: float = Field(
        default=1 / 60,
        ge=0,
        le=1,
        description="Pharos. The periodic detection re-judges each fail-slow window but the shortest when "
        "this share of its length has passed (1/60: 4 h every 4 min, 96 h every 96 min), reusing the "
        "verdicts in between, so a cycle does not re-read days of rollups every period; 0 = every cycle.",
    )
    failslow_shortest_refresh_share: float = Field(
        default=1 / 60,
        ge=0,
        le=1,
        description="Pharos. The periodic detection re-judges the shortest fail-slow window when this share of "
        "its length has passed (1/60: 1 h every minute; a window of a minute or less every cycle of 1 s or more), "
        "reusing its verdicts in between: at 40,960 simulated nodes one judgement of the 1 h window reads ~17 M "
        "rows of io_rollup_forwarder_1m. A node's state then lags by at most that; 0 = every cycle.",
    )
    failslow_windows_per_cycle: int = Field(
        default=1,
        ge=1,
        description="Pharos. Long fail-slow windows (all but the shortest) the periodic detection judges per "
        "cycle at most: after a start they are judged over the first cycles, so no cycle reads days of "
        "rollups at once; until all are judged no node is called persistent.",
    )
    failslow_bw_ratio: float = Field(
        default=0.5,
        gt=0,
        le=1,
        description="Beacon §5.3. A node is slow when its average AND maximum bandwidth are below this "
        "share of the peers' mean maximum bandwidth ...",
    )
    failslow_volume_ratio: float = Field(
        default=0.6,
        ge=0,
        description="Beacon §5.3. ... while it serves more than this share of the peers' mean volume (bytes).",
    )
    failslow_z: float = Field(
        default=3.5,
        gt=0,
        description="Pharos (Iglewicz-Hoaglin cut-off). Robust z-score (median/IQR scaled to a standard "
        "deviation, on log features) above which a node's service time is an outlier among its peers.",
    )
    failslow_min_ratio: float = Field(
        default=2.0,
        gt=1,
        description="Pharos. The outlier must also be this many times slower (service time per byte, against "
        "the peers' median) so that a tight peer group does not turn small differences into alerts.",
    )
    failslow_min_added_ms: float = Field(
        default=1.0,
        ge=0,
        description="Pharos. A target must also take at least this many ms longer per request (at its mean "
        "request size) than its peers' median: a 2-3x difference between sub-millisecond requests of a "
        "RAM- or cache-backed target is CPU scheduling noise, not a failing device.",
    )
    forwarder_silence_s: float = Field(
        default=10.0,
        gt=0,
        description="Pharos. A forwarding daemon whose newest batch (records, or its heartbeat every 2 s) is older "
        "than this (s), while another daemon is heard, is silent: cut off, stopped or hung "
        "(pharos_analytics.liveness; anomaly kind forwarder_silent).",
    )
    network_window_s: float = Field(
        default=15.0,
        gt=0,
        description="Pharos. Window (s) over which each compute node's network overhead to its forwarding nodes "
        "is measured (pharos_analytics.network; anomaly kind network_slow).",
    )
    network_min_requests: int = Field(
        default=10,
        ge=1,
        description="Pharos. Data requests through the mount a compute node needs in the window to be judged.",
    )
    network_slow_ms: float = Field(
        default=20.0,
        gt=0,
        description="Pharos. Network overhead per request (ms: the mount's latency seen by the agent minus the "
        "forwarding node's queue wait and service time) from which a compute node's path can be slow.",
    )
    network_slow_ratio: float = Field(
        default=5.0,
        gt=1,
        description="Pharos. ... and that is at least this many times the median overhead of the other compute nodes.",
    )
    failslow_min_ops: int = Field(
        default=20, ge=1, description="Pharos. Requests a node must have served in a window to be judged (load guard)."
    )
    failslow_min_utilization: float = Field(
        default=0.5,
        ge=0,
        le=100,
        description="Pharos. A node with fewer than failslow_min_ops requests in a window is still judged when "
        "its summed service time is at least this share of the window (a target slowed 8x serves a few "
        "requests per second, each in service for a long time).",
    )
    failslow_min_busy_share: float = Field(
        default=0.3,
        ge=0,
        le=1,
        description="Pharos. Share (0-1) of the window's intervals in which the node served requests (load guard).",
    )
    failslow_min_peers: int = Field(
        default=3, ge=2, description="Pharos. Nodes (including the judged one) needed for a peer comparison."
    )
    failslow_stall_added_ms: float = Field(
        default=20.0,
        gt=0,
        description="Pharos, after Perseus (FAST'23: latency judged against throughput among peers). A "
        "forwarding node stalls when its requests wait at least this many ms longer (mean queue wait, "
        "counted from the kernel's receipt of each request) than its loaded peers' median, and "
        "failslow_min_ratio times it, while it served no more than failslow_stall_served_ratio times "
        "their median (requests, bytes): a wait that is not its load.",
    )
    failslow_stall_served_ratio: float = Field(
        default=1.2,
        ge=1,
        description="Pharos. A stalled forwarding node served at most this many times its loaded peers' "
        "median requests and bytes in the window. Nodes under the same jobs serve within a few "
        "percent of each other, and a stalled daemon that catches up in bursts serves its share; "
        "a node whose waits are its load serves clearly more (a heavy job on it: several times).",
    )
    failslow_critical_ratio: float = Field(
        default=4.0,
        gt=1,
        description="Pharos. Slowdown (x peers' median) at which a fail-slow anomaly is critical, else warning.",
    )
    # -- interference (Pharos) -------------------------------------------------------------
    interference_window_s: float = Field(
        default=60.0,
        gt=0,
        description="Pharos. Width (s) of the windows in which a job's co-located jobs are compared.",
    )
    interference_lookback_s: float = Field(
        default=3600.0,
        gt=0,
        description="Pharos. History (s) the periodic detection reads for interference (quiet baselines + current windows).",
    )
    interference_latency_ratio: float = Field(
        default=1.5,
        gt=1,
        description="Pharos. Rise of a job's mean latency (queue wait + service, per request) against its "
        "quiet baseline that counts as interference.",
    )
    interference_min_added_ms: float = Field(
        default=1.0,
        ge=0,
        description="Pharos. Minimum rise (ms per request) of the job's latency to count as interference.",
    )
    interference_min_requests: int = Field(
        default=10, ge=1, description="Pharos. Requests a job needs in a window (and in its baseline) to be judged."
    )
    interference_mechanism_share: float = Field(
        default=0.5,
        ge=0,
        le=1,
        description="Pharos. Share (0-1) of the job's latency rise that must be the resource's own kind of wait "
        "for it to be named: queue wait at a forwarding node (its workers held by another job), service time at a "
        "target (its bandwidth taken). A rise in service time alone (the job's own slow target) blames no "
        "forwarding node.",
    )
    interference_min_occupancy: float = Field(
        default=0.1,
        ge=0,
        description="Pharos. A culprit's requests must have been in service on the shared resource for at least "
        "this share of the window (summed service time / window: its mean requests in service), so that a few "
        "requests of another job or of no job are not blamed.",
    )
    interference_settle_s: float = Field(
        default=120.0,
        ge=0,
        description="Pharos. The periodic detection keeps the sums of a window between its cycles once the window "
        "ended this long (s) before the cycle, instead of reading its whole look-back every cycle; records that reach "
        "the store later than that are left out of its view of the window (one job's report still reads them).",
    )
    # -- alerts and the periodic detection of the server (Pharos) -------------------------------
    alertmanager_url: str = Field(
        default="", description="Pharos. Alertmanager base URL (http://host:9093); '' = do not send to Alertmanager."
    )
    alert_webhook_url: str = Field(
        default="", description="Pharos. Generic JSON webhook receiving the same alerts; '' = off."
    )
    alert_resend_s: float = Field(
        default=60.0,
        gt=0,
        description="Pharos. An open alert is re-sent (same labels) at least this often so Alertmanager keeps it firing.",
    )
    alert_ends_after_s: float = Field(
        default=300.0,
        gt=0,
        description="Pharos. endsAt of a firing alert is now + this: if Pharos stops re-sending, Alertmanager resolves it.",
    )
    detect_period_s: float = Field(
        default=10.0,
        ge=0,
        description="Pharos. Period (s) of the server's fail-slow + interference detection and alerting; 0 = off.",
    )
    status_window_s: float = Field(
        default=60.0,
        gt=0,
        description="Pharos. Look-back (s) of the 'recent' numbers of /v1/targets and /v1/forwarders.",
    )
