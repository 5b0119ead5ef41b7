"""Online migration off a fail-slow target (issue 27, item 1: the Sunway storage paper's migration
of data off anomalous storage nodes, GVDS's MODM bandwidth allocation), driven by the real
control loop against a real pharos-fwd and pharos-mount on loopback.

Setup: one daemon, 8 targets limited to ``--target-mb-s`` (1000) MB/s each (token buckets), one
mount. ``nn``: 8 files of ``--file-mib`` MiB written by an N-N fio job (crc32c headers), one per
target (round-robin, stripe count 1), and a ``cold`` set of ``--cold-mib`` MiB files the same
way (data the job does not read, also on every target: the migration lasts through the
foreground runs). The loop's pool ``pharos`` holds the 8 targets.

Why the targets are not the bottleneck of the healthy job: as in the Sunway storage paper's
case (one anomalous storage node among many), losing one target of eight must not cost
bandwidth by itself; were each target saturated (e.g. 8 x 200 MB/s here), the job after the
migration would have 7 targets for 8 files, 2 files on one of them, and could reach at most half
the healthy figure whatever the migration does (measured: 0.48).

1. **H** (healthy) and **S** (slowed), alternating ``--rounds`` times: the N-N read of ``nn``
   (fio ``--verify_only``: every block read and its checksum checked) with no slow target, then
   with one target slowed 10x through the admin fault interface (``PUT /targets/{name}
   {"slowdown": 10}``; its rank straggles).
2. The fail-slow detections of that target are written to the store's ``anomalies`` every 5 s
   as the detection loop writes them (active, for longer than ``migration_persist_s``; the
   detection itself is measured by bench/failslow_windows.py). A real ``ControlLoop.cycle`` with
   migration off: the placement step drops the target from the pool and makes the pool the
   default one.
3. A real cycle with migration on (a new ``ControlLoop`` per cycle, as after a restart): the
   migration step plans the migration of the target's files (``POST /migrations``, MODM cap
   ``--cap-mb-s``). **F during** and **F alone**, alternating ``--rounds`` times (rotating
   order): a foreground N-N write (``fg``: 4 ranks, new files placed by the pool, crc32c
   verified) while the migration copies, and the same job with the migration paused (its cap set
   to 0 through ``PUT /migrations``: the tasks stay copying and move nothing), so both see the
   same files, dirty pages and load (the number of tasks copying at the end of each run during
   the migration is printed).
4. **SIGKILL**: the daemon is killed while a task copies (its journal entry on disk), restarted
   on the same ports with the placement it held (recovery rolls each entry back or forward),
   every file of ``nn``, ``cold`` and ``fg`` verified through the mount; the loop's next cycle
   finds the daemon lost the episode's tasks and plans them again (``resume``); they complete.
5. **A** (after; the target still slowed and now holding nothing of the job) alternating with
   **H** again (its slowdown removed).
6. Every file verified again; no layout names the slow target.

Each ratio is the median over the rounds of one run over the run it alternated with in that
round (adjacent runs see the same load of the shared machine; the load drifts over a run): S over
the healthy run of 1, A over that of 5, F during over F alone of 3. The ratios of the medians are
printed too.

Ends with ``migration: after/healthy A, slowed/healthy S, foreground during/alone F, verified
yes|no``. Goals (issue 27): A >= 0.90, F >= 0.90. Runs in a few minutes; root, /dev/fuse, fio.

Usage: uv run python bench/migration.py [--rounds 5] [--file-mib 256] [--cap-mb-s 20] [--bin DIR] [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import benchkit
from benchkit import kit
from pharos_testkit import free_port

sys.path.insert(0, str(benchkit.REPO / "tests" / "control"))
# the detection loop's rows of a fail-slow target, as the tests write them
from test_migration_plan import failslow

from pharos_analytics.control.config import ControlConfig
from pharos_analytics.control.loop import ControlLoop
from pharos_core.settings import Settings
from pharos_core.store import migrate, open_store

TARGETS = [f"ost{i}" for i in range(8)]
SLOWDOWN = 10.0
S = 1_000_000_000


class Rig:
    """One pharos-fwd (fixed ports: it is restarted on them) and one pharos-mount under ``root``."""

    def __init__(self, root: Path, target_mb_s: float) -> None:
        self.root = root
        self.backend = root / "backend"
        self.limits = [a for t in TARGETS for a in ("--limit", f"{t}={target_mb_s:g}")]
        self.port, self.admin_port = free_port(), free_port()
        self.procs: list[subprocess.Popen] = []
        self.mounts: list[Path] = []
        self.fwd: subprocess.Popen | None = None
        self.mnt = root / "mnt"

    @property
    def admin(self) -> str:
        return f"http://127.0.0.1:{self.admin_port}"

    def start_daemon(self, placement: dict | None = None) -> None:
        argv = [
            str(kit.BIN / "pharos-fwd"),
            *("--node-name", "fwd0", "--listen", f"127.0.0.1:{self.port}", "--admin", f"127.0.0.1:{self.admin_port}"),
            *("--mdt", str(self.backend / "mdt"), "--targets-root", str(self.backend)),
            *("--target-count", str(len(TARGETS)), "--no-kafka", "--workers", "32", *self.limits),
            *(["--placement", json.dumps(placement)] if placement else []),
            *benchkit.auth_flags(self.root),
        ]
        (self.root / "fwd0.ready").unlink(missing_ok=True)
        n = sum(1 for p in self.procs if p.args[0].endswith("pharos-fwd"))
        benchkit.start_ready(argv, self.root, f"fwd0-{n}", self.procs)
        self.fwd = self.procs[-1]

    def start_mount(self) -> None:
        self.mnt.mkdir(exist_ok=True)
        argv = [
            str(kit.BIN / "pharos-mount"),
            *("--mountpoint", str(self.mnt), "--fwd", f"fwd0=127.0.0.1:{self.port}", "--admin", "127.0.0.1:0"),
            *benchkit.auth_flags(self.root),
        ]
        benchkit.start_ready(argv, self.root, "mnt", self.procs)
        self.mounts.append(self.mnt)

    def http(self, method: str, path: str, body: dict | None = None) -> dict:
        return kit.http(method, self.admin + path, body)

    def layouts(self) -> dict[str, list[int]]:
        """Namespace path -> target indexes of its layout sidecar."""
        ns = self.backend / "mdt" / "ns"
        out = {}
        for p in ns.rglob("*"):
            if p.is_file():
                m = re.search(r"targets=([0-9,]+)", p.read_text())
                out["/" + str(p.relative_to(ns))] = [int(t) for t in m.group(1).split(",")] if m else []
        return out

    def close(self) -> None:
        benchkit.stop_all(self.procs, self.mounts)


def nn_args(ranks: int, mib: int) -> list[str]:
    """The N-N job: ``ranks`` files of ``mib`` MiB, 1 MiB requests, crc32c verification headers."""
    return [
        "--name=nn",
        "--rw=write",
        "--bs=1m",
        f"--numjobs={ranks}",
        f"--size={mib}m",
        "--verify=crc32c",
        "--verify_state_save=0",
        "--verify_fatal=1",
    ]


def write(d: Path, ranks: int, mib: int) -> dict:
    """Write the N-N files in ``d`` and read every block back (verified); fio's job summary."""
    d.mkdir(exist_ok=True)
    return benchkit.fio(d, *nn_args(ranks, mib), "--do_verify=1")


def read_verify(d: Path, ranks: int, mib: int) -> float:
    """The N-N read of ``d`` with every block's checksum checked (fio exits on a bad block, and
    the run stops); aggregate read bandwidth, MB/s (10^6 B/s)."""
    job = benchkit.fio(d, *nn_args(ranks, mib), "--verify_only")
    assert job["read"]["io_bytes"] == ranks * mib << 20, job["read"]
    return job["read"]["bw_bytes"] / 1e6


def verify_all(rig: Rig, ranks: int, mib: int, cold_mib: int, fg_mib: int, errors: list[str]) -> bool:
    """Every block of every file written so far (nn, cold, each fg-* run) read back through the
    mount with its checksum checked; a failure is added to ``errors`` (False)."""
    sets = [("nn", ranks, mib), ("cold", ranks, cold_mib)]
    sets += [(d.name, 4, fg_mib) for d in sorted(rig.mnt.glob("fg-*"))]
    ok = True
    for d, n, sz in sets:
        try:
            read_verify(rig.mnt / d, n, sz)
        except (SystemExit, AssertionError) as exc:
            errors.append(f"{d}: {str(exc)[:300]}")
            ok = False
    return ok


def fg_job(rig: Rig, tag: str, mib: int) -> float:
    """The foreground job: a 4-rank N-N write of new files (placed by the pool) then its verified
    read-back; the write bandwidth, MB/s."""
    job = write(rig.mnt / f"fg-{tag}", 4, mib)
    return job["write"]["bw_bytes"] / 1e6


def wait(pred, timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > end:
            sys.exit(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.1)


def run(root: Path, args: argparse.Namespace) -> dict:
    res: dict = {"verified": True}
    rig = Rig(root, args.target_mb_s)
    store = open_store(Settings(state_dir=root / "state"))
    migrate(store)
    try:
        pool = {"targets": TARGETS, "max_perf": {t: args.target_mb_s for t in TARGETS}, "stripe_count": 1}
        # round-robin until the loop makes its pool the default one: one nn file per target
        rig.start_daemon({"pools": {"pharos": pool}, "stripe_count": 1, "stripe_size": 1 << 20})
        rig.start_mount()
        ranks, mib = len(TARGETS), args.file_mib
        write(rig.mnt / "nn", ranks, mib)
        write(rig.mnt / "cold", ranks, args.cold_mib)
        lay = rig.layouts()
        per_target = [sum(1 for p, ts in lay.items() if p.startswith("/nn/") and i in ts) for i in range(len(TARGETS))]
        if per_target != [1] * len(TARGETS):
            sys.exit(f"the nn files are not one per target: {per_target}")
        slow_i = 3
        slow = TARGETS[slow_i]
        # H and S alternate (the fault set and removed through the admin interface), so that the
        # load of the machine falls on both alike
        res["H_runs"], res["S_runs"] = [], []
        for _ in range(args.rounds):
            rig.http("PUT", f"/targets/{slow}", {"slowdown": 1.0})
            res["H_runs"].append(read_verify(rig.mnt / "nn", ranks, mib))
            rig.http("PUT", f"/targets/{slow}", {"slowdown": SLOWDOWN})
            res["S_runs"].append(read_verify(rig.mnt / "nn", ranks, mib))
        # the fail-slow detections (every 5 s, as the detection loop stores them), then the real
        # control cycles: the first with migration off (the placement step drops the target and makes
        # the pool the default: the foreground job alone is measured on that pool), then with it on
        seen = [time.time_ns() - 60 * S]

        def cycle(**kw) -> dict:
            now = time.time_ns()
            failslow(store, slow, list(range(now - (now - seen[0]) // (5 * S) * 5 * S, now + 1, 5 * S)), SLOWDOWN)
            seen[0] = now
            cfg = ControlConfig(**(base_cfg | kw))
            return ControlLoop(store, Settings(state_dir=root / "state"), lambda: cfg).cycle(now)

        base_cfg = dict(
            fwd_admin_urls={"fwd0": rig.admin},
            mount_admin_urls=[],
            admin_token_file=root / "admin.token",
            remap_enabled=False,
            placement_component_size=0,
            anomaly_max_age_s=60,
            migration_persist_s=30,
            migration_episode_gap_s=30,
            migration_max_total_mb_s=args.cap_mb_s,
            migration_min_mb_s=min(5.0, args.cap_mb_s),
            migration_max_active=2,
        )
        cycle(migration_enabled=False)
        res["pool_after"] = rig.http("GET", "/placement")["pools"]["pharos"]["targets"]
        t_plan = time.monotonic()
        summary = cycle()
        loop = ControlLoop(store, Settings(state_dir=root / "state"), lambda: ControlConfig(**base_cfg))
        planned = [a for a in loop.actions(kind="migration") if a["resource"] == f"target:{slow}"]
        if summary["migrations"] != 1 or not planned or planned[0]["status"] != "applied":
            sys.exit(f"the loop did not plan the migration: {summary} {planned}")
        res["plan"] = planned[0]
        ids = set(planned[0]["evidence"]["ids"])

        def tasks() -> list[dict]:
            return [t for t in rig.http("GET", "/migrations")["tasks"] if t["id"] in ids]

        wait(lambda: any(t["state"] == "copying" for t in tasks()), 30, "a task copying")
        # F during / F alone, alternating (rotating order): alone = the same state with the
        # migration paused (its cap set to 0 through PUT /migrations: the tasks stay copying and
        # move nothing), during = the cap given back
        settings = rig.http("GET", "/migrations")["settings"]
        res["F_during_runs"], res["F_alone_runs"], res["copying_after_F"] = [], [], []
        for i in range(args.rounds):
            for side in ("alone", "during") if i % 2 == 0 else ("during", "alone"):
                cap = 0.0 if side == "alone" else args.cap_mb_s
                rig.http("PUT", "/migrations", settings | {"max_total_mb_s": cap})
                time.sleep(0.5)
                res[f"F_{side}_runs"].append(fg_job(rig, f"{side}{i}", args.fg_mib))
                if side == "during":
                    res["copying_after_F"].append(sum(1 for t in tasks() if t["state"] == "copying"))
        rig.http("PUT", "/migrations", settings)
        res["migrated_during_F"] = sum(t["bytes_done"] for t in tasks())
        # SIGKILL mid-migration, restart on the same ports
        journal = rig.backend / "mdt" / "migrations"
        wait(
            lambda: any(t["state"] == "copying" and t["bytes_done"] > 0 for t in tasks()) and any(journal.iterdir()),
            60,
            "a copy under way with its journal entry",
        )
        res["killed_at"] = [(t["id"], t["state"], t["bytes_done"]) for t in tasks() if t["state"] != "queued"]
        held = rig.http("GET", "/placement")  # a site restarts a daemon with its placement configuration
        rig.fwd.kill()
        rig.fwd.wait(10)
        res["journal_at_kill"] = len(list(journal.iterdir()))
        rig.start_daemon(held)
        log = (root / f"fwd0-{sum(1 for p in rig.procs if p.args[0].endswith('pharos-fwd')) - 1}.log").read_text()
        m = re.search(r"migration journal: (\d+) rolled back, (\d+) rolled forward, (\d+) kept", log)
        res["recovery"] = m.group(0) if m else "no recovery line"
        res["slowdown_after_restart"] = next(t for t in rig.http("GET", "/targets") if t["name"] == slow).get(
            "slowdown"
        )
        rig.http("PUT", f"/targets/{slow}", {"slowdown": SLOWDOWN})
        res["errors"] = []
        res["verified_after_kill"] = verify_all(rig, ranks, mib, args.cold_mib, args.fg_mib, res["errors"])
        res["verified"] = res["verified_after_kill"]
        # the loop's next cycle resumes the episode on the restarted daemon
        cycle()
        again = [a for a in loop.actions(kind="migration") if a["resource"] == f"target:{slow}"]
        res["resume"] = again[0]["evidence"]["action"] if len(again) > len(planned) else "none"
        ids = set(again[0]["evidence"]["ids"])
        wait(lambda: all(t["state"] in ("done", "failed", "cancelled") for t in tasks()), 300, "the migration")
        res["tasks"] = tasks()
        res["migration_s"] = time.monotonic() - t_plan
        if not all(t["state"] == "done" for t in res["tasks"]):
            res["verified"] = False
        # A (the target still slowed, holding nothing of the job now) alternating with the same job
        # with no slow target at all (its slowdown removed): H_end
        res["A_runs"], res["H_end_runs"] = [], []
        for _ in range(args.rounds):
            res["A_runs"].append(read_verify(rig.mnt / "nn", ranks, mib))
            rig.http("PUT", f"/targets/{slow}", {"slowdown": 1.0})
            res["H_end_runs"].append(read_verify(rig.mnt / "nn", ranks, mib))
            rig.http("PUT", f"/targets/{slow}", {"slowdown": SLOWDOWN})
        left = {p: ts for p, ts in rig.layouts().items() if slow_i in ts}
        res["left_on_slow"] = sorted(left)
        if left:
            res["verified"] = False
        if not verify_all(rig, ranks, mib, args.cold_mib, args.fg_mib, res["errors"]):
            res["verified"] = False
        res["overview"] = loop.migrations_overview()
        res["slow"] = slow
    finally:
        rig.close()
        store.close()
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5, help="runs of each measured job (median)")
    ap.add_argument("--file-mib", type=int, default=256, help="size of each N-N file")
    ap.add_argument("--cold-mib", type=int, default=128, help="size of each file the job does not read")
    ap.add_argument("--fg-mib", type=int, default=64, help="size of each foreground file")
    ap.add_argument("--target-mb-s", type=float, default=1000.0, help="token-bucket limit of each target")
    ap.add_argument("--cap-mb-s", type=float, default=20.0, help="total cap of migration (MODM)")
    ap.add_argument("--bin", type=Path, default=None, help="pharos-fwd / pharos-mount folder (default: build)")
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()
    benchkit.use_binaries(args.bin)
    t0 = time.monotonic()
    with benchkit.scratch_dir("pharos-migration-", args.workdir, args.keep) as root:
        r = run(root, args)
    med = {k: statistics.median(r[k + "_runs"]) for k in ("H", "H_end", "S", "A", "F_alone", "F_during")}
    # each ratio against the healthy runs it alternated with (the same load of the machine)
    pairs = {
        k: [x / y for x, y in zip(r[num], r[den], strict=True)]
        for k, num, den in (
            ("A", "A_runs", "H_end_runs"),
            ("S", "S_runs", "H_runs"),
            ("F", "F_during_runs", "F_alone_runs"),
        )
    }
    a, s, f = (statistics.median(pairs[k]) for k in ("A", "S", "F"))
    of_medians = (med["A"] / med["H_end"], med["S"] / med["H"], med["F_during"] / med["F_alone"])
    fmt = lambda xs: ", ".join(f"{x:.0f}" for x in xs)  # noqa: E731
    print(f"targets: 8 x {args.target_mb_s:g} MB/s; {r['slow']} slowed {SLOWDOWN:g}x; N-N read 8 x {args.file_mib} MiB")
    print(f"H healthy   {med['H']:7.1f} MB/s  (before the fault, alternating with S: runs {fmt(r['H_runs'])})")
    print(
        f"H healthy   {med['H_end']:7.1f} MB/s  (after the migration, the slowdown removed, alternating with A: "
        f"runs {fmt(r['H_end_runs'])})"
    )
    print(f"S slowed    {med['S']:7.1f} MB/s  (runs {fmt(r['S_runs'])})")
    print(f"A after     {med['A']:7.1f} MB/s  (runs {fmt(r['A_runs'])})")
    print(
        f"F foreground 4 x {args.fg_mib} MiB write: during migration {med['F_during']:.1f} MB/s "
        f"(runs {fmt(r['F_during_runs'])}; tasks still copying at the end of each: {r['copying_after_F']}; "
        f"{r['migrated_during_F'] / 2**20:.0f} MiB moved by then), "
        f"alone (the migration paused, alternating) {med['F_alone']:.1f} MB/s (runs {fmt(r['F_alone_runs'])})"
    )
    print(f"plan: {r['plan']['to_state']} ({r['plan']['reason']}); pool after the cycle: {r['pool_after']}")
    print(
        f"SIGKILL mid-copy at {r['killed_at']} ({r['journal_at_kill']} journal entries); restart: {r['recovery']}; "
        f"every file verified after it: {'yes' if r['verified_after_kill'] else 'no'}; loop's next cycle: {r['resume']}"
    )
    for t in r["tasks"]:
        print(
            f"  task {t['id']} {t['path']}: {t['state']} {t['source_target']} -> {t['dest_target']}, "
            f"{t['bytes_done'] / 2**20:.0f} MiB, {t['achieved_mb_s']:.1f} MB/s achieved (cap {args.cap_mb_s:g})"
        )
    print(
        f"migration planned -> done in {r['migration_s']:.1f} s; left on {r['slow']}: {r['left_on_slow'] or 'nothing'}"
    )
    for e in r["errors"]:
        print(f"verification failed: {e}")
    print(f"wall {time.monotonic() - t0:.0f} s; load average at the end {os.getloadavg()[0]:.1f} (2 cores, shared)")
    for k, name in (("A", "after/healthy"), ("S", "slowed/healthy"), ("F", "foreground during/alone")):
        print(f"{name} per round (adjacent runs): {', '.join(f'{x:.3f}' for x in pairs[k])}")
    print(
        "ratios of the medians instead: after/healthy {:.3f}, slowed/healthy {:.3f}, foreground {:.3f}".format(
            *of_medians
        )
    )
    verified = "yes" if r["verified"] else "no"
    print(
        f"migration: after/healthy {a:.3f}, slowed/healthy {s:.3f}, foreground during/alone {f:.3f}, verified {verified}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
