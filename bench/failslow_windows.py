"""What a detection cycle reads at a site's size, per second against per minute (issue 28, item 3).

Fail-slow detection judges look-back windows of 1 h, 4 h, 12 h and 96 h (Beacon NSDI'19 §5.3),
and the interference pass reads an hour of 60 s windows. Read from the per-second rollup
(io_rollup_1s), the shortest window alone is seconds x (forwarding node, target, job) rows every
cycle: 27,600 rows per second at 1,024 simulated compute nodes (``bench/simulate.py``), 99 M per
hour. Migration 014 adds per-minute and per-10-minute rollups of the forwarder layer; a window is
read in the coarsest that still cuts it into ``failslow_min_intervals`` (60) intervals
(:func:`pharos_analytics.failslow_sql.rollup_step`).

This bench fills a chDB store with ``--hours`` of forwarder-layer records shaped as a site's
rollup is: each second each of ``--forwarders`` forwarding nodes serves the same
``--targets-per-forwarder`` of ``--targets`` targets (one record per (second, forwarding node,
target), one job per pair; 240 x 115 is what 1,024 simulated nodes give), one forwarding node
slowed ``--slowdown`` x. It then times, on the same store, alternating over ``--rounds``:

* the fail-slow windows (default ``failslow_windows_s``), each judged as a cold cycle judges it:
  read per second (``failslow_min_intervals`` so large that every window reads io_rollup_1s: the
  code before migration 014) and read per the rollup levels (the default);
* the interference pass's usage query over its look-back (``interference_lookback_s``, 60 s
  windows): from io_rollup_1s, and from the per-minute rollup with per-second edges; both must
  give the same rows (checked); then the whole interference pass (usage read + detection), once.

Prints the seconds of each and the ratio per second / per level, the slowed node found by each,
and last::

    failslow windows: rows/s R, window W s: per-second P s, per-level L s, ratio X; interference ratio Y, pass Z s

Usage: ``uv run python bench/failslow_windows.py [--hours 1.05] [--forwarders 240]
[--targets-per-forwarder 115] [--targets 1280] [--rounds 2] [--keep DIR]``. Everything stops by
itself; the store is removed unless ``--keep``.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

FILL_SQL = """
INSERT INTO io_requests (start, end, duration_ns, layer, host, job_id, rank, pid, tid, comm, op, file_type,
                         dev, inode, path, fd, offset, size, result, count, bytes, compute_node,
                         forwarding_node, target, object_id, queue_wait_ns, request_id, replay,
                         producer_id, seq, record_index)
SELECT
    fromUnixTimestamp64Nano(toInt64({t0:Int64} + sec * 1000000000 + i * 997), 'UTC') AS start,
    fromUnixTimestamp64Nano(toInt64({t0:Int64} + sec * 1000000000 + i * 997 + dur), 'UTC') AS end,
    dur AS duration_ns, 'forwarder' AS layer, concat('cn', toString(pair % 1024)) AS host,
    concat('job', toString(pair % {jobs:UInt64})) AS job_id, toInt32(pair % 64) AS rank, 1000 AS pid,
    1000 AS tid, 'ior' AS comm, if(sec % 5 = 0, 'pread', 'pwrite') AS op, 'regular' AS file_type, 2049 AS dev,
    10000 + pair AS inode, concat('/scratch/out.', toString(pair)) AS path, 3 AS fd, sec * 2097152 AS offset,
    1048576 AS size, 1048576 AS result, 2 AS count, 2097152 AS bytes, concat('cn', toString(pair % 1024)) AS compute_node,
    concat('fwd', toString(fwd)) AS forwarding_node, concat('ost', toString((fwd * 53 + k) % {targets:UInt64})) AS target,
    pair AS object_id, 20000 + (n % 7) * 1000 AS queue_wait_ns, n AS request_id, 0 AS replay,
    'bench' AS producer_id, intDiv(n, 1000) AS seq, toUInt32(n % 1000) AS record_index
FROM
(
    SELECT number AS n, intDiv(n, {per_sec:UInt64}) AS sec, n % {per_sec:UInt64} AS i,
           intDiv(i, {k:UInt64}) AS fwd, i % {k:UInt64} AS k, fwd * {k:UInt64} + k AS pair,
           toUInt64((4000000 + (n % 13) * 100000) * if(fwd = {slow:UInt64}, {slowdown:Float64}, 1)) AS dur
    FROM numbers({n:UInt64})
)
SETTINGS max_insert_block_size = 1048576
"""


def timed(fn):
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog="See the module docstring.")
    ap.add_argument("--hours", type=float, default=1.05, help="hours of records (the 1 h window + a little)")
    ap.add_argument("--forwarders", type=int, default=240)
    ap.add_argument("--targets-per-forwarder", type=int, default=115)
    ap.add_argument("--targets", type=int, default=1280)
    ap.add_argument("--jobs", type=int, default=50)
    ap.add_argument("--slowdown", type=float, default=3.0, help="service time factor of fwd7")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--keep", type=Path, help="keep (or reuse) the store in this directory")
    a = ap.parse_args()

    from pharos_analytics import interference
    from pharos_analytics.diagnosis_config import DiagnosisConfig
    from pharos_analytics.failslow import detect_failslow
    from pharos_analytics.failslow_sql import forwarder_rollup
    from pharos_core.store import ChdbStore, migrate

    root = a.keep or Path(tempfile.mkdtemp(prefix="pharos-fswin-"))
    store = ChdbStore(root / "chdb")
    per_sec = a.forwarders * a.targets_per_forwarder
    secs = int(a.hours * 3600)
    now_ns = (int(time.time()) // 60 * 60 - 3600) * 10**9  # a past minute: every record is in
    t0 = now_ns - secs * 10**9
    try:
        migrate(store)
        have = int(store.query("SELECT count() AS n FROM io_requests")[0]["n"])
        if have != per_sec * secs:
            store.command("TRUNCATE TABLE io_requests")
            for t in ("io_rollup_1s", "io_rollup_1m", "io_rollup_forwarder_1m", "io_rollup_forwarder_10m"):
                store.command(f"TRUNCATE TABLE {t}")
            print(f"filling {per_sec * secs:,} records ({secs} s x {per_sec:,} per s) ...", flush=True)
            chunk = 600  # seconds per INSERT: bounded memory
            t = time.perf_counter()
            for s0 in range(0, secs, chunk):
                n = min(chunk, secs - s0) * per_sec
                p = {"t0": t0 + s0 * 10**9, "per_sec": per_sec, "k": a.targets_per_forwarder, "n": n}
                p |= {"targets": a.targets, "jobs": a.jobs, "slow": 7, "slowdown": a.slowdown}
                store.command(FILL_SQL, p)
                print(f"  {s0 + chunk}/{secs} s stored ({time.perf_counter() - t:.0f} s)", flush=True)
            t = time.perf_counter()
            while time.perf_counter() - t < 900 and int(store.query("SELECT count() AS n FROM system.merges")[0]["n"]):
                time.sleep(2)
        else:
            now_ns = int(store.query("SELECT toUnixTimestamp(max(sec)) + 1 AS t FROM io_rollup_1s")[0]["t"]) * 10**9
        rows = {
            t: int(store.query(f"SELECT count() AS n FROM {t}")[0]["n"])
            for t in ("io_rollup_1s", "io_rollup_forwarder_1m", "io_rollup_forwarder_10m")
        }
        print("rollup rows: " + ", ".join(f"{t} {n:,}" for t, n in rows.items()), flush=True)

        base = DiagnosisConfig()
        per_second = base.model_copy(update={"failslow_min_intervals": 10**9})
        res: dict[tuple[str, float], list[float]] = {}
        found: dict[tuple[str, float], set] = {}
        for r in range(a.rounds):
            order = [("per-second", per_second), ("per-level", base)]
            for name, cfg in order if r % 2 == 0 else order[::-1]:
                for w in cfg.failslow_windows_s:
                    one = cfg.model_copy(update={"failslow_windows_s": [w]})
                    dt, rep = timed(lambda one=one: detect_failslow(store, one, now_ns=now_ns, kinds=("forwarder",)))
                    res.setdefault((name, w), []).append(dt)
                    found[(name, w)] = {x.node for x in rep.anomalies}
                    print(f"round {r}: {name:10} window {w:>8.0f} s: {dt:6.2f} s, flagged {sorted(found[(name, w)])}")
        win = int(base.interference_window_s * 1e9)
        since = -(-(now_ns - int(base.interference_lookback_s * 1e9)) // win) * win
        usage = {}
        for r in range(a.rounds):
            for name, step in (
                (("per-second", 1), ("per-level", 60)) if r % 2 == 0 else (("per-level", 60), ("per-second", 1))
            ):
                sql = interference.ROLLUP_USAGE_SQL.replace("__SRC__", forwarder_rollup(since, now_ns, step))
                dt, out = timed(lambda sql=sql: store.query(sql.replace("__JOBS__", ""), {"win": win}))
                res.setdefault((name, "interference"), []).append(dt)
                usage[name] = sorted(out, key=lambda x: (x["job_id"], x["w"], x["rtype"], x["res"]))
                print(f"round {r}: {name:10} interference usage ({len(out):,} rows): {dt:6.2f} s")
        if usage["per-second"] != usage["per-level"]:
            sys.exit("interference usage differs between the per-second and the per-level reads")
        # the whole interference pass of a detection cycle (its usage read above + the detection)
        until = now_ns // win * win
        dt_pass, events = timed(lambda: interference.detect_interference(store, base, since_ns=since, until_ns=until))
        print(f"interference pass ({base.interference_lookback_s / 3600:g} h, {len(events)} events): {dt_pass:.2f} s")
        print("\n| window | per-second (s) | per-level (s) | ratio | flagged per-second / per-level |")
        print("|---|---|---|---|---|")
        for w in base.failslow_windows_s:
            ps, pl = min(res[("per-second", w)]), min(res[("per-level", w)])
            fs = ",".join(sorted(found[("per-second", w)])) or "-"
            fl = ",".join(sorted(found[("per-level", w)])) or "-"
            print(f"| {w / 3600:g} h | {ps:.2f} | {pl:.2f} | {ps / pl:.1f} | {fs} / {fl} |")
        isec, ilev = min(res[("per-second", "interference")]), min(res[("per-level", "interference")])
        print(
            f"| interference usage, {base.interference_lookback_s / 3600:g} h | {isec:.2f} | {ilev:.2f} | {isec / ilev:.1f} | |"
        )
        w0 = min(base.failslow_windows_s)
        ps, pl = min(res[("per-second", w0)]), min(res[("per-level", w0)])
        print(
            f"failslow windows: rows/s {per_sec}, window {w0:g} s: per-second {ps:.2f} s, per-level {pl:.2f} s, "
            f"ratio {ps / pl:.1f}; interference ratio {isec / ilev:.1f}, pass {dt_pass:.2f} s"
        )
    finally:
        store.close()
        if not a.keep:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
