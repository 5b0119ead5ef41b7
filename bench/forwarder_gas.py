"""Gather-Arrange-Scatter (Ohta et al., IEEE Cluster 2010) on the forwarding daemon against
uncoordinated writes (issue 12, item 3), through the real daemon and the real mount.

Two stacks side by side, each one pharos-fwd (8 targets, --no-kafka) and one pharos-mount (one
compute node): ``--gas on`` (defaults: 16 MiB buffer per compute node, 5 ms flush) and
``--gas off``. The workload is 8 ranks writing one shared file in interleaved 64 KiB blocks: fio
``numjobs=8`` on one file, job j writing blocks j, j+8, j+16, ... (``offset_increment=64k``,
``rw=write:448k``), 8 MiB per job, psync, then ``--verify=crc32c`` reading every block back. Each
round runs both stacks (order alternating, after a sync) on fresh files. Printed: write MB/s of each and the
ratio on/off (median and range of the per-round ratios), and from the daemons' GET /metrics the
write requests issued to the targets per client write received (and their ratio on/off).
``--socket``: the mounts send data over the socket (``--shm-slots 0``), as compute nodes on other
hosts do (the deployed case; a gathered write then keeps its receive buffer, no copy).

Usage: python bench/forwarder_gas.py [--rounds 3] [--mib-per-rank 8] [--target-latency-ms 0] [--socket]
       [--bin DIR] [--keep]   (root, /dev/fuse, fio)
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
from pathlib import Path

from benchkit import daemon_metrics, kit, scratch_dir, use_binaries

RANKS = 8
BLOCK = 64 << 10
PER_RANK_MB = 8
SIDES = ("on", "off")


#: The daemon's counters of client writes received and of write requests issued to the targets.
COUNTERS = ("pharos_fwd_client_writes_total", "pharos_fwd_backend_write_requests_total")


def counters(d: kit.Daemon) -> tuple[float, float]:
    """(client writes received, write requests issued to the targets) from GET /metrics."""
    vals = daemon_metrics(d, tuple(f"{c} " for c in COUNTERS))
    return vals[COUNTERS[0]], vals[COUNTERS[1]]


def interleaved_fio(directory: Path, per_rank_mb: int = PER_RANK_MB) -> dict:
    """8 jobs, one shared file, interleaved 64 KiB blocks, then verify; fio's job summary."""
    out = kit.fio(
        "--name=gas", f"--directory={directory}", *kit.n1_interleaved_args(RANKS, BLOCK, per_rank_mb << 20), timeout=300
    )
    job = out["jobs"][0]
    if job["error"]:
        raise SystemExit(f"fio error {job['error']}")
    want = RANKS * per_rank_mb << 20
    if job["write"]["io_bytes"] != want or job["read"]["io_bytes"] != want:
        raise SystemExit(f"fio wrote {job['write']['io_bytes']} and verified {job['read']['io_bytes']} of {want}")
    return job


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--bin", type=Path, default=None, help="pharos-fwd/pharos-mount from this dir (no build)")
    ap.add_argument("--workdir", default="/var/tmp")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument(
        "--socket",
        action="store_true",
        help="data over the socket (mount --shm-slots 0), as from compute nodes on other hosts",
    )
    ap.add_argument("--mib-per-rank", type=int, default=PER_RANK_MB, help="MiB each fio job writes (longer runs)")
    ap.add_argument(
        "--target-latency-ms",
        type=float,
        default=0.0,
        help="latency added to every target request on both stacks (pharos-fwd --latency-ms), as remote targets have",
    )
    ap.add_argument(
        "--gas-args", default="", help="extra pharos-fwd flags of the gas-on stack, e.g. '--gas-flush-ms 20'"
    )
    a = ap.parse_args()
    use_binaries(a.bin)
    with scratch_dir("pharos-gas-", a.workdir, a.keep) as root:
        clusters = []
        try:
            stacks = {}
            for side in SIDES:
                c = kit.Cluster(root / side)
                c.root.mkdir()
                clusters.append(c)
                lat = [
                    f"--latency-ms=ost{i}={a.target_latency_ms}" for i in range(c.n_targets) if a.target_latency_ms > 0
                ]
                d = c.start_daemon("fwd0", "--gas", side, *lat, *(a.gas_args.split() if side == "on" else []))
                stacks[side] = (d, c.start_mount([d], 0, *(["--shm-slots", "0"] if a.socket else [])))
            print(
                f"# GAS on/off: {RANKS} ranks (fio jobs) x {a.mib_per_rank} MiB in interleaved {BLOCK >> 10} KiB blocks of "
                f"one file, then crc32c verify; {a.rounds} rounds, order alternating; target latency {a.target_latency_ms} ms; "
                f"data {'over the socket' if a.socket else 'through shared memory'}; "
                f"tmp {root}"
            )
            bw = {s: [] for s in SIDES}
            per = {s: [] for s in SIDES}
            for r in range(a.rounds):
                for side in SIDES if r % 2 == 0 else SIDES[::-1]:
                    d, m = stacks[side]
                    os.sync()  # the other side's dirty pages are not this run's writeback
                    w0, b0 = counters(d)
                    (m.path / f"r{r}").mkdir()
                    job = interleaved_fio(m.path / f"r{r}", a.mib_per_rank)
                    w1, b1 = counters(d)
                    bw[side].append(job["write"]["bw_bytes"] / 1e6)
                    per[side].append((b1 - b0) / (w1 - w0))
                    print(
                        f"round {r} gas {side:3}: {bw[side][-1]:8.1f} MB/s, {w1 - w0:.0f} client writes -> "
                        f"{b1 - b0:.0f} backend write requests ({per[side][-1]:.3f} per write), verify ok",
                        flush=True,
                    )
                    shutil.rmtree(m.path / f"r{r}")
            ratios = [on / off for on, off in zip(bw["on"], bw["off"], strict=True)]
            req = [on / off for on, off in zip(per["on"], per["off"], strict=True)]
            print(f"{'':22} {'gas on':>10} {'gas off':>10} {'on/off':>8} {'range':>12}")
            print(
                f"{'write MB/s (median)':22} {statistics.median(bw['on']):10.1f} {statistics.median(bw['off']):10.1f} "
                f"{statistics.median(ratios):8.2f} {min(ratios):5.2f}-{max(ratios):<5.2f}"
            )
            print(
                f"{'backend writes/write':22} {statistics.median(per['on']):10.3f} {statistics.median(per['off']):10.3f} "
                f"{statistics.median(req):8.3f} {min(req):5.3f}-{max(req):<5.3f}"
            )
            return 0
        finally:
            for c in clusters:
                c.close()


if __name__ == "__main__":
    raise SystemExit(main())
