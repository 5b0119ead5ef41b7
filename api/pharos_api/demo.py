"""``pharos demo`` (the main job): trace three real fio jobs end to end and report them.

Starts the embedded stack (``pharos up``: broker, eBPF agent, forwarding daemons, the
FUSE mount, pipeline + API), runs an N-N job (4 ranks, a file each), an N-1 job (4 ranks,
one shared file, disjoint offsets) and a 1-1 job (1 rank) through ``pharos run`` on the
forwarding layer's mount, then prints each job's summary from the API, as the eBPF agent
saw it on the compute node (client layer) and as the forwarding daemons served it
(forwarder layer), next to what fio itself reported in its JSON output. Exit code 0 only if
every pattern is right and every job's ``bytes_written`` equals fio's bytes exactly on
every layer.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
from rich.console import Console

from pharos_agents.runner import run_job
from pharos_core import api_client
from pharos_core.settings import Settings

from . import stack
from .cli_jobs import api_headers


@dataclass(frozen=True)
class FioJob:
    """One demo job: ``fio_args`` is a shell word list; ``$PHAROS_RANK`` expands per rank.

    ``shared_file``: (name, bytes) of a file the job's ranks share, created at its final
    size before the ranks start, as an MPI application's collective create would. Without
    it, each independent fio process that finds the file shorter than its own offset +
    size unlinks and re-creates it (fio's layout step), racing the other ranks.
    """

    kind: str
    ranks: int
    fio_args: str
    shared_file: tuple[str, int] | None = None

    def prepare(self, data_dir: Path) -> None:
        """Create the job's shared file, if any, at its final size (sparse)."""
        if self.shared_file is not None:
            name, size = self.shared_file
            with open(data_dir / name, "wb") as f:
                f.truncate(size)


DEMO_JOBS = [
    FioJob("N-N", 4, "--rw=write --bs=1m --size=32m --filename={dir}/data.$PHAROS_RANK"),
    FioJob(
        "N-1",
        4,
        "--rw=write --bs=256k --size=16m --filename={dir}/shared --offset=$((PHAROS_RANK*16))m",
        shared_file=("shared", 4 * 16 * 2**20),
    ),
    FioJob("1-1", 1, "--rw=write --bs=4k --size=32m --filename={dir}/single"),
]

FIO_COMMON = "--ioengine=psync --end_fsync=1 --output-format=json --disk_util=0"


def fio_command(job: FioJob, data_dir: Path, name: str) -> list[str]:
    """The rank command: a shell that expands the rank's offsets, then execs fio."""
    args = job.fio_args.format(dir=data_dir)
    return ["sh", "-c", f"exec fio --name={name} {FIO_COMMON} {args}"]


def fio_totals(outputs: list[Path]) -> dict[str, int]:
    """Sum fio's JSON results over ranks: bytes and I/O counts per direction.

    Raises ValueError if a rank's output holds no JSON document.
    """
    totals = {"bytes_written": 0, "bytes_read": 0, "writes": 0, "reads": 0}
    for out in outputs:
        text = out.read_text()
        start = text.find("{")
        if start < 0:
            raise ValueError(f"no fio JSON in {out}")
        doc = json.loads(text[start:])
        for j in doc["jobs"]:
            totals["bytes_written"] += j["write"]["io_bytes"]
            totals["bytes_read"] += j["read"]["io_bytes"]
            totals["writes"] += j["write"]["total_ios"]
            totals["reads"] += j["read"]["total_ios"]
    return totals


def wait_for_summary(
    api_url: str, job_id: str, expect_bytes: int, timeout_s: float = 60.0, layer: str = "client"
) -> dict | None:
    """Poll ``GET /v1/jobs/{job_id}?layer=...`` at ``api_url`` (``http://host:port`` or
    ``unix:<socket>``) until the job is finished and its bytes_written has
    reached ``expect_bytes`` and stayed unchanged for a second (late records settle), or
    until the timeout. Returns the last summary seen, or None if the job never appeared."""
    deadline = time.monotonic() + timeout_s
    last, stable_since = None, None
    while time.monotonic() < deadline:
        try:
            r = api_client.request(
                api_url, "GET", f"/v1/jobs/{job_id}", params={"layer": layer}, headers=api_headers(), timeout=5
            )
        except httpx.HTTPError:
            r = None
        if r is not None and r.status_code == 200:
            cur = r.json()
            done = cur.get("state") in ("finished", "failed") and cur.get("bytes_written", 0) >= expect_bytes
            if last is not None and cur.get("bytes_written") == last.get("bytes_written") and done:
                stable_since = stable_since or time.monotonic()
                if time.monotonic() - stable_since >= 1.0:
                    return cur
            else:
                stable_since = None
            last = cur
        time.sleep(0.25)
    return last


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def run_demo(settings: Settings, console: Console, keep_running: bool = True) -> int:
    """Run the demo; returns the process exit code (0 when every check holds)."""
    console.rule("[bold]Pharos demo: starting the embedded stack")
    stack.start(settings, progress=lambda s: console.print(f"  {s}"))
    stamp = time.strftime("%y%m%d%H%M%S")
    on_mount = settings.fwd_nodes > 0
    base = (settings.mount_point if on_mount else settings.state_dir) / "demo" / stamp
    results = []
    for job in DEMO_JOBS:
        job_id = f"{job.kind.lower().replace('-', '')}-{stamp}"
        data_dir = base / job_id
        data_dir.mkdir(parents=True, exist_ok=True)
        console.rule(f"[bold]{job.kind} job {job_id}: {job.ranks} rank(s) of fio")
        job.prepare(data_dir)
        cmd = fio_command(job, data_dir, job.kind)
        console.print("  " + " ".join(cmd))
        res = run_job(
            settings,
            job_id,
            cmd,
            ranks=job.ranks,
            name=f"fio-{job.kind}",
            output_dir=settings.state_dir / "demo-output" / job_id,
            report=lambda line: console.print("  " + line, highlight=False),
        )
        if res.exit_code != 0:
            console.print(f"[red]  fio failed with exit code {res.exit_code}[/]")
            results.append((job, job_id, None, None, None))
            continue
        fio = fio_totals(res.outputs)
        url = api_client.client_url(settings)  # the Unix socket here: no token needed
        summary = wait_for_summary(url, job_id, fio["bytes_written"])
        fwd = wait_for_summary(url, job_id, fio["bytes_written"], layer="forwarder") if on_mount else None
        results.append((job, job_id, fio, summary, fwd))
        shutil.rmtree(data_dir, ignore_errors=True)

    console.rule("[bold]Pharos per-job summaries vs fio's own JSON")
    ok_all = True
    for job, job_id, fio, s, fwd in results:
        if fio is None or s is None:
            ok_all = False
            console.print(f"[red]NO [/] {job_id}: {'fio failed' if fio is None else 'no summary from the API'}")
            continue
        writes = sum(v for k, v in s["ops"].items() if k in ("write", "pwrite", "writev"))
        ok = s["pattern"] == job.kind and s["bytes_written"] == fio["bytes_written"] and writes == fio["writes"]
        if on_mount:
            ok &= fwd is not None and fwd["bytes_written"] == fio["bytes_written"] and fwd["pattern"] == job.kind
        ok_all &= ok
        mark = "[green]OK [/]" if ok else "[red]NO [/]"
        console.print(
            f"{mark} [bold]{job_id}[/]  pattern [bold]{s['pattern']}[/] (expected {job.kind}), "
            f"{s['io_ranks']} I/O rank(s), {s['n_files']} file(s)",
            highlight=False,
        )
        console.print(
            f"    bytes written {s['bytes_written']} (fio: {fio['bytes_written']}), "
            f"writes {writes} (fio: {fio['writes']})",
            highlight=False,
        )
        console.print(
            f"    {s['data_records']} record(s) for {s['data_requests']} data requests after merging, "
            f"{_mib(s['bytes_written'])}, dropped records: {s['dropped_records']}",
            highlight=False,
        )
        if fwd is not None:
            console.print(
                f"    forwarding layer: {fwd['bytes_written']} bytes written in {fwd['data_requests']} "
                f"requests, pattern {fwd['pattern']}",
                highlight=False,
            )
    console.print(
        f"Per-job reports: [bold]pharos job <ID>[/]; all jobs: [bold]pharos jobs[/]; "
        f"API {settings.api_url}/v1/jobs (OpenAPI {settings.api_url}/docs)"
    )
    if keep_running:
        console.print("The stack keeps running; stop it with [bold]pharos down[/].")
    else:
        stack.stop(settings)
    return 0 if ok_all else 1
