"""Thresholds and switches of the control loop: ONE config, every default sourced.

Override any field in the Pharos settings file (``pharos.toml``, or the file named by
``PHAROS_CONFIG``) under a ``[control]`` table, or with an environment variable
``PHAROS_CONTROL_<FIELD>`` (e.g. ``PHAROS_CONTROL_DRY_RUN=true``). Precedence: explicit
arguments, environment, file, defaults: the same pydantic-settings sources as
:class:`~pharos_analytics.diagnosis_config.DiagnosisConfig` (``[diagnosis]``).

Sources of the defaults:

* **Beacon** (Yang et al., NSDI'19), the classifier released with it and used by DFRA: a
  job *benefits from more forwarding nodes* when its I/O pattern is N-N or N-1, it moves
  ≥ 20 GB, it issues ≤ 1,000 metadata operations per data operation, and ≥ 32 processes
  do I/O. Metadata-heavy: > 1,000 metadata operations per second on the job's files (not on
  system paths) over runs of at least ``metadata_sustained_s``, read from
  :class:`~pharos_analytics.diagnosis_config.DiagnosisConfig` ``metadata_rate_ops_s``
  (``[diagnosis]``): one threshold for the diagnosis and the control loop.
* **DFRA** (Ji et al., FAST'19 §3-4): the decision is taken at job dispatch from the history
  of the job's earlier runs (same name, user, command): default mapping, more forwarding
  nodes, or dedicated forwarding nodes; metadata-heavy jobs are isolated on dedicated nodes;
  the number of nodes follows the predicted demand over one node's capacity; dedicated
  nodes come from a reserved set and are returned when the job ends.
* **Sunway storage lessons** §5: performance-aware pools (``max_perf`` per target), slow
  targets kept out of the pool; and the migration of data off anomalous storage nodes (an N-N
  job went from 20 to about 70 GB/s once its data left them).
* **Sunway storage lessons** §6 (remote node-local storage): N-N jobs whose metadata load is on the
  shared namespace are the ones node-local mode is for; the control loop suggests it in the DFRA
  decision (``dfra_node_local_*``) for N-N jobs that are metadata-heavy (Beacon's rate above) or
  whose metadata operations dominate.
* **GVDS** (Huo et al. 2024), its multi-task data migration module (MODM): each migration task
  is guaranteed a minimum bandwidth, the rest of a total cap goes by priority, data moves in
  bounded units (the daemons' engine, forwarder/README.md "Online migration").
* **Pharos**: the rest (periods, hysteresis, quiet period, measurement windows), chosen here
  and marked so in the field descriptions.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from pharos_core.settings import PharosSettings

from ..pattern import Pattern

GB = 1_000_000_000
MiB = 1 << 20


class ControlConfig(PharosSettings):
    """Every threshold of :mod:`pharos_analytics.control` (DFRA, live remapping, placement hints,
    the loop itself). Units are in the field names: ``_s`` seconds, ``_b_s`` bytes/s, ``_bytes``
    bytes."""

    model_config = SettingsConfigDict(env_prefix="PHAROS_CONTROL_", extra="ignore")
    toml_table = "control"

    # -- the loop (Pharos) --------------------------------------------------------------------
    period_s: float = Field(
        default=10.0, ge=0, description="Pharos. Period (s) of the control loop in `pharos serve`; 0 = off."
    )
    dry_run: bool = Field(
        default=False,
        description="Pharos. Decide and record every action (status 'recorded') without pushing anything "
        "to the mount or the daemons.",
    )
    http_timeout_s: float = Field(
        default=3.0, gt=0, description="Pharos. Timeout (s) of one admin HTTP call to a mount or daemon."
    )
    retry_max_backoff_s: float = Field(
        default=300.0,
        gt=0,
        description="Pharos. A failed push is retried next cycle, then with doubling back-off up to this (s).",
    )
    mount_admin_urls: list[str] = Field(
        default_factory=list,
        description="Pharos. Admin base URLs of the FUSE clients (http://127.0.0.1:7501). Empty: the one "
        "`pharos up` starts (its ready file, else Settings.mount_admin_port).",
    )
    fwd_admin_urls: dict[str, str] = Field(
        default_factory=dict,
        description="Pharos. Forwarding node name -> admin base URL of its daemon. Empty: fwd0..fwd<N-1> of "
        "`pharos up` (ready files, else Settings.fwd_port_base + 10 i + 1).",
    )
    admin_token_file: Path | None = Field(
        default=None,
        description="Pharos. The file holding the admin token the mounts' and daemons' admin interfaces "
        "require (sent as a Bearer token). None: Settings.fwd_admin_token_file (by default "
        "<state_dir>/fwd-admin.token, the one `pharos up` makes).",
    )
    liveness_timeout_s: float = Field(
        default=0.5,
        gt=0,
        description="Pharos. Timeout (s) of the background liveness checks hints read (GET /status of each "
        "daemon, GET /mapping of each mount, all at once) and of a claimed hint's calls to the mounts: a hint "
        "answers within the Slurm plugin's 2 s even when an admin interface accepts connections and never "
        "answers. The control cycle's own checks use http_timeout_s.",
    )
    liveness_max_age_s: float = Field(
        default=5.0,
        gt=0,
        description="Pharos. A hint reads the liveness view of the forwarding layer as it is; one older than this "
        "(s) is refreshed in the background (the control cycle refreshes it too).",
    )
    lease_s: float = Field(
        default=600.0,
        gt=0,
        description="Pharos. Lease (s) of a reserved forwarding node held by a started job: renewed by the job's "
        "start event, its newest stored I/O record and, with lease_slurm, Slurm saying the job is pending or "
        "running; a lease not renewed for this long expires and the node is returned (a 'lease_expired' "
        "action): an end event that never arrived does not hold a node forever. Default: 60 control periods.",
    )
    lease_slurm: bool = Field(
        default=False,
        description="Pharos. Ask Slurm (squeue, when slurm_squeue is on PATH) which holders of reserved nodes "
        "are pending or running, every cycle: their leases are renewed even without I/O.",
    )
    slurm_squeue: str = Field(
        default="squeue", description="Pharos. The squeue command lease_slurm runs (name on PATH, or a path)."
    )
    slurm_timeout_s: float = Field(default=5.0, gt=0, description="Pharos. Timeout (s) of one squeue call.")
    active_job_max_age_s: float = Field(
        default=7 * 86400.0,
        gt=0,
        description="Pharos. A job with a start event and no end event is active for at most this long (s).",
    )
    anomaly_max_age_s: float = Field(
        default=120.0,
        gt=0,
        description="Pharos. Fail-slow and interference results of the detection loop older than this (s) "
        "are not acted on.",
    )
    # -- DFRA at job start (Beacon NSDI'19 classifier; DFRA FAST'19 §3-4) -----------------------
    dfra_patterns: list[Pattern] = Field(
        default=["N-N", "N-1"],
        description="Beacon (NSDI'19) / DFRA. I/O patterns that can use more forwarding nodes.",
    )
    dfra_min_bytes: float = Field(
        default=20 * GB,
        ge=0,
        description="Beacon / DFRA. Bytes moved per run (mean of the history) from which "
        "a job benefits from more forwarding nodes (20 GB).",
    )
    dfra_max_metadata_per_data_op: float = Field(
        default=1000.0,
        ge=0,
        description="Beacon / DFRA. At most this many metadata operations per data operation for a job to benefit.",
    )
    dfra_min_io_ranks: int = Field(
        default=32, ge=1, description="Beacon / DFRA. Processes (ranks) doing I/O needed for a job to benefit."
    )
    dfra_dedicated_min_bytes: float = Field(
        default=1000 * GB,
        ge=0,
        description="Pharos (DFRA gives no number). Bytes per run from which a benefiting job gets dedicated "
        "(reserved) forwarding nodes instead of more shared ones: very high volume (1 TB).",
    )
    dfra_history_runs: int = Field(
        default=5, ge=1, description="Pharos. Newest earlier runs (same name, user, command) a decision reads."
    )
    dfra_saturation_ratio: float = Field(
        default=0.8,
        gt=0,
        le=1,
        description="Pharos. A run whose bandwidth reached this share of (node capacity x nodes it used) was "
        "limited by its forwarding nodes: it is given at least one node more than it had.",
    )
    dfra_more_nodes_min: int = Field(
        default=2, ge=2, description="Pharos. 'More forwarding nodes' means at least this many."
    )
    # -- node-local mode suggested in the decision (Sunway storage paper §6; Beacon metadata-heavy) -
    dfra_node_local_enabled: bool = Field(
        default=True,
        description="Pharos. The DFRA decision says whether the job's history suggests node-local mode "
        "(control/dfra.py node_local_suggestion; the job asks for it: srun --pharos-node-local=MOUNT, "
        "pharos run --node-local MOUNT).",
    )
    dfra_node_local_patterns: list[Pattern] = Field(
        default=["N-N"],
        description="Sunway storage paper §6. I/O patterns whose jobs node-local mode suits: each rank's files "
        "its own, in the rank's private directory (a file shared by ranks, N-1, cannot be).",
    )
    dfra_node_local_min_metadata_per_data_op: float = Field(
        default=1.0,
        ge=0,
        description="Pharos. Metadata operations per data operation from which "
        "metadata dominates a job that is not metadata-heavy (Beacon's rate, [diagnosis] metadata_rate_ops_s): "
        "as many opens, creates and stats as reads and writes, i.e. small files.",
    )
    dfra_node_local_min_metadata_ops: float = Field(
        default=10_000.0,
        ge=0,
        description="Pharos. Metadata operations per run (mean of the history) a metadata-dominated job also "
        "needs: a small job's few opens and closes, however many per data operation, are no load on the "
        "shared namespace.",
    )
    # -- learned job classes when there is no exact history (Pharos; DFRA FAST'19 §3-4 history) -
    dfra_model_enabled: bool = Field(
        default=True,
        description="Pharos. A job without exact history (same name, user, command) gets the class a model "
        "trained on the stored history predicts (control/class_model.py), when it is confident enough.",
    )
    dfra_model_min_confidence: float = Field(
        default=0.7,
        ge=0,
        le=1,
        description="Pharos. The model's probability of its class below which the job keeps the default "
        "(the model is unsure).",
    )
    dfra_model_min_jobs: int = Field(
        default=20,
        ge=2,
        description="Pharos. Finished jobs with I/O the history needs before the model is used.",
    )
    dfra_model_max_jobs: int = Field(
        default=5000, ge=2, description="Pharos. Newest finished jobs the model is trained on."
    )
    dfra_model_lookback_s: float = Field(
        default=90 * 86400.0, gt=0, description="Pharos. Jobs started this long ago (s) or later train the model."
    )
    dfra_model_retrain_s: float = Field(
        default=600.0,
        ge=0,
        description="Pharos. The model is retrained from the store when older than this (s); 0 = for every "
        "decision without exact history.",
    )
    dfra_model_classifier: Literal["logistic", "forest"] = Field(
        default="forest",
        description="Pharos (bench/dfra_class_model.py, docs/papers.md: exact match then the forest 0.889 on the "
        "time-ordered split, exact match alone 0.667; logistic regression is less sure: 6 of 18 jobs below 0.7). "
        "scikit-learn "
        "classifier of the class: a random forest (200 bagged trees, every feature at every split) or logistic "
        "regression (balanced class weights).",
    )
    reserved_nodes: list[str] = Field(
        default=["fwd2", "fwd3"],
        description="DFRA. Forwarding nodes kept out of the default mapping and handed out, one job at a time, "
        "as dedicated nodes. Default: fwd2, fwd3, the 2 of the 4 daemons `pharos up` starts (Settings.fwd_nodes) "
        "that `pharos mount` keeps out of its default mapping; names that do not exist are ignored.",
    )
    reservation_start_grace_s: float = Field(
        default=300.0,
        gt=0,
        description="Pharos. Reserved nodes handed to a job (hint) that has not started after this (s) are returned.",
    )
    node_capacity_b_s: float = Field(
        default=0.0,
        ge=0,
        description="Pharos. One forwarding node's capacity (bytes/s). 0 = measured: the highest per-node p99 "
        "of per-second forwarded bytes over capacity_lookback_s.",
    )
    node_capacity_fallback_b_s: float = Field(
        default=500e6,
        gt=0,
        description="Pharos. Capacity (bytes/s) assumed before any forwarder traffic has been measured.",
    )
    capacity_lookback_s: float = Field(
        default=86400.0, gt=0, description="Pharos. History (s) the node capacity is measured over."
    )
    load_window_s: float = Field(
        default=30.0, gt=0, description="Pharos. Window (s) of the current load (bytes/s) of each forwarding node."
    )
    # -- live remapping (Pharos; DFRA is static once a job runs) -------------------------------
    remap_enabled: bool = Field(default=True, description="Pharos. Act on interference events by remapping.")
    remap_min_interval_s: float = Field(
        default=300.0,
        ge=0,
        description="Pharos (hysteresis). A job is not moved again within this many seconds of its last move.",
    )
    remap_max_moves_per_cycle: int = Field(
        default=1, ge=0, description="Pharos. At most this many jobs are moved per control cycle."
    )
    remap_min_load_gain: float = Field(
        default=0.2,
        ge=0,
        le=1,
        description="Pharos (hysteresis). The destination's load plus the moved job's must stay below "
        "(1 - this) x the source node's load, so near-equal loads never trade a job back and forth.",
    )
    # -- placement-pool hints (Sunway lessons §5) -----------------------------------------------
    placement_enabled: bool = Field(default=True, description="Pharos. Maintain the placement pool.")
    placement_pool: str = Field(
        default="pharos", description="Pharos. Name of the pool the loop maintains (made the default pool)."
    )
    placement_component_size: int = Field(
        default=2 * MiB,
        ge=0,
        description="Pharos (bench/placement.py: 2 MiB components reach 0.96-0.99 of the summed bandwidth). "
        "component_size of the pool when the loop creates it (0 = whole-file placement); an existing pool keeps its own.",
    )
    placement_window_s: float = Field(
        default=120.0, gt=0, description="Pharos. Window (s) of target metrics max_perf is measured over."
    )
    placement_quantile: float = Field(
        default=0.9,
        gt=0,
        le=1,
        description="Pharos. max_perf = this quantile of a target's bandwidth in its loaded intervals "
        "(served with a queue or throttled: bandwidth under load, not the configured limit).",
    )
    placement_min_loaded_intervals: int = Field(
        default=5, ge=1, description="Pharos. Loaded intervals needed for a measured max_perf."
    )
    placement_min_change: float = Field(
        default=0.15,
        ge=0,
        description="Pharos (hysteresis). A pool is re-pushed only when a target joins or leaves it, or a "
        "max_perf moves by more than this share.",
    )
    placement_quiet_s: float = Field(
        default=300.0,
        ge=0,
        description="Pharos. A fail-slow target returns to the pool after this many seconds without an active "
        "fail-slow detection.",
    )
    # -- online migration off persistently fail-slow targets (Sunway storage paper; GVDS MODM) --
    migration_enabled: bool = Field(
        default=True,
        description="Pharos. Plan migrations off persistently fail-slow targets (control/migration.py): POST "
        "/migrations to a forwarding daemon once per fail-slow episode of a target. Needs the loop's placement pool on the daemons "
        "(placement_enabled): destinations are its targets, and the slow target must be out of it.",
    )
    migration_persist_s: float = Field(
        default=300.0,
        ge=0,
        description="Pharos (Beacon NSDI'19 §5.3 calls a slow node persistent when it stays slow over widening "
        "windows; the number is ours). A target is migrated off once its fail-slow detections have been active "
        "for this long (s) without a break: a transient slowdown moves no data.",
    )
    migration_episode_gap_s: float = Field(
        default=180.0,
        gt=0,
        description="Pharos. A fail-slow episode of a target ends when no active detection of it is stored for "
        "longer than this (s); the next detection starts a new episode (planned again once persistent). "
        "Default: a few detection periods, above anomaly_max_age_s.",
    )
    migration_daemon: str = Field(
        default="",
        description="Pharos. The forwarding node whose daemon runs the migrations (the daemons share the "
        "namespace: one daemon plans each file once, and its cap is the site's migration cap). '' = the first "
        "daemon, by name, that answers.",
    )
    migration_min_mb_s: float = Field(
        default=10.0,
        ge=0,
        description="GVDS MODM (the minimum each task is guaranteed; the value is the daemons' default). MB/s "
        "(10^6 B/s) per migration task.",
    )
    migration_max_mb_s: float = Field(
        default=0.0, ge=0, description="GVDS MODM. Ceiling (MB/s) of one task; 0 = none (the total cap bounds it)."
    )
    migration_priority: int = Field(
        default=0,
        ge=-(2**31),
        le=2**31 - 1,
        description="GVDS MODM. Priority of the loop's tasks: the bandwidth above the minimums goes to the "
        "highest priority first (an admin's tasks at a higher priority go first).",
    )
    migration_unit_bytes: int = Field(
        default=MiB,
        ge=4096,
        le=64 * MiB,
        description="GVDS MODM (bounded migration units). Bytes copied per unit (the daemons' default, 1 MiB).",
    )
    migration_max_total_mb_s: float = Field(
        default=0.0,
        ge=0,
        description="GVDS MODM (the total cap that keeps foreground I/O its bandwidth). MB/s of all migration of "
        "the migrating daemon, set (PUT /migrations) before it plans; 0 = leave the daemon's own "
        "(--migration-max-mb-s, 200).",
    )
    migration_max_active: int = Field(
        default=0,
        ge=0,
        description="Pharos. Tasks copying at once on the migrating daemon, set with the cap; 0 = leave the "
        "daemon's own (--migration-max-active, 4).",
    )
