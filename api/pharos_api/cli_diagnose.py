"""``pharos diagnose JOB`` and ``pharos import darshan LOG...``.

``diagnose`` asks the API (like ``pharos job``): ``GET /v1/jobs/{id}/insights``, then
``GET /v1/jobs/{id}/interference`` (printed when the server has it; not in ``--json``).

``import darshan`` works with or without the stack. chDB allows one process per data
directory, so: if the API answers (``pharos serve`` / ``pharos up`` holds the store, here or
remote), each log is uploaded (``POST /v1/import/darshan/upload``, the file's bytes as the
body, with the API token: role admin; the server opens no path of ours); otherwise the
command opens the store itself, migrates it and imports. With a ClickHouse server
(``PHAROS_CLICKHOUSE_URL``) it always opens the store directly. If the chDB directory is
locked by another process and no API answers, it fails with one line.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text

from pharos_core.units import lost_text

from .cli_jobs import ApiError, ApiOption, JsonOption, _api_url, _fail, api_get, api_request, human_bytes

_SEV_STYLE = {"high": "bold red", "warn": "yellow", "info": "dim"}
IMPORT_TIMEOUT_S = 600.0


def _share(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def describe_profile(p: dict) -> str:
    """One plain-words line for an access profile (the API's JSON)."""
    if p["reads"] + p["writes"] == 0:
        words = "no data I/O"
    else:
        dom = {"read": "read-dominant", "write": "write-dominant", "mixed": "mixed reads and writes"}[p["direction"]]
        pats = p.get("patterns") or {}
        detail = ", ".join(f"{d}s {pats[d]}" for d in ("write", "read") if pats.get(d, "none") != "none")
        words = (
            f"{p['pattern']} ({p['io_ranks']} rank(s) on {p['n_files']} file(s)"
            + (f"; {detail}" if detail else "")
            + f"), {dom}, "
            f"{p['access']} ({_share(p['sequential_share'])} sequential), "
            f"{p['size_class']} requests ({_share(p['small_share'])} under 1 MiB), "
            f"{p['alignment']} ({_share(p['misaligned_share'])} off {p['alignment_bytes']} B)"
        )
        words += f"; wrote {human_bytes(p['bytes_written'])}, read {human_bytes(p['bytes_read'])}"
    if p["metadata_ops"]:
        words += f"; {p['metadata_ops']} metadata ops" + (", metadata-heavy" if p["metadata_heavy"] else "")
    return words


def render_diagnosis(console: Console, d: dict) -> None:
    ph = d["phases"]
    console.print(Text.assemble(("job ", "bold"), (d["job_id"], "bold cyan"), f"  (evidence: {ph['source']})"))
    if ph["job"] is None:
        console.print("no I/O recorded for this job")
    else:
        console.print(Text("pattern: " + describe_profile(ph["job"])))
        if ph["job"]["duration_s"]:
            console.print(f"I/O span {ph['job']['duration_s']:.3f} s")
    if ph["phases"]:
        console.print(f"[bold]phases[/bold] ({len(ph['phases'])}, split at idle gaps of {ph['gap_s']:g} s or more):")
        for p in ph["phases"]:
            pr = p["profile"]
            console.print(Text(f"  {p['index']:>2}. +{pr['duration_s']:.3f} s  " + describe_profile(pr)))
    elif ph["source"] == "counters":
        console.print("phases: none (Darshan counters only, no per-request trace)")
    if not d["insights"]:
        console.print("[green]insights: nothing to flag[/green]")
    else:
        console.print(f"[bold]insights[/bold] ({len(d['insights'])}, by seconds lost):")
        for i in d["insights"]:
            lost = i.get("seconds_lost")
            code = f", Drishti {i['drishti_code']}" if i.get("drishti_code") else ""
            console.print(
                Text.assemble(
                    ("  " + i["severity"].upper().ljust(5), _SEV_STYLE[i["severity"]]),
                    " ",
                    (lost_text(lost).ljust(16) if lost is not None else "(not priced)".ljust(16), "bold"),
                    " ",
                    (i["title"], "bold"),
                    f" [{i['id']}, {i['source']}{code}]",
                )
            )
            console.print(Text("        " + i["message"]))
            if basis := i["evidence"].get("seconds_lost_basis"):
                console.print(Text("        price: " + basis, style="dim"))
            for r in i["recommendations"]:
                console.print(Text("        -> " + r))
    for n in d.get("notes", []):
        console.print(Text("note: " + n, style="dim"))


def _import_via_api(url: str, paths: list[Path], job_id: str | None, name: str | None) -> list[dict] | None:
    """Results of uploading each log to the API, or None when no API answers."""
    from .cli_tokens import api_answers

    if not api_answers(url):
        return None
    out = []
    for p in paths:
        params = {"filename": p.name} | ({"job_id": job_id} if job_id else {}) | ({"name": name} if name else {})
        try:
            with p.open("rb") as f:
                r = api_request(
                    url,
                    "POST",
                    "/v1/import/darshan/upload",
                    params=params,
                    content=f,
                    headers={"Content-Type": "application/octet-stream"},
                    timeout=IMPORT_TIMEOUT_S,
                )
        except OSError as exc:
            from pharos_pipeline.darshan_import import LogImport

            out.append(asdict(LogImport(path=str(p), status="failed", error=f"{p}: {exc.strerror or exc}")))
            continue
        out += [res | {"path": str(p)} for res in r.json()["results"]]
    return out


def _import_direct(paths: list[Path], job_id: str | None, name: str | None, console: Console) -> list[dict]:
    from pharos_pipeline.darshan_import import import_log

    from .cli_tokens import with_store

    def run(store) -> list[dict]:
        out = []
        with Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            transient=True,
            disable=len(paths) < 2,
        ) as bar:
            task = bar.add_task("importing Darshan logs", total=len(paths))
            for p in paths:
                bar.update(task, description=f"importing {p.name[:40]}")
                out.append(asdict(import_log(store, p, job_id=job_id, name=name)))
                bar.advance(task)
        return out

    return with_store(run)


def register(app: typer.Typer) -> None:
    """Add ``diagnose`` and ``import darshan`` to ``app``."""

    @app.command("diagnose")
    def diagnose_cmd(
        job_id: Annotated[str, typer.Argument(help="Job id.")],
        api: ApiOption = None,
        as_json: JsonOption = False,
    ) -> None:
        """Why was the job's I/O slow: pattern, phases and insights with recommendations."""
        url = _api_url(api)
        try:
            r = api_get(url, f"/v1/jobs/{quote(job_id, safe='')}/insights")
        except ApiError as exc:
            _fail(str(exc))
        if as_json:
            typer.echo(r.text)
            return
        console = Console()
        render_diagnosis(console, r.json())
        # the interference the job suffered (forwarder-layer data; optional: older servers lack it)
        try:
            inter = api_get(url, f"/v1/jobs/{quote(job_id, safe='')}/interference").json()
        except (ApiError, ValueError):
            return
        from .cli_system import render_interference

        render_interference(console, inter)

    imp = typer.Typer(help="Import I/O records from other tools.", no_args_is_help=True)
    app.add_typer(imp, name="import")

    @imp.command("darshan")
    def import_darshan_cmd(
        logs: Annotated[list[Path], typer.Argument(help="Darshan log files (.darshan).", exists=True, dir_okay=False)],
        job_id: Annotated[str | None, typer.Option("--job-id", help="Import every log into this one job.")] = None,
        name: Annotated[str | None, typer.Option("--name", help="Job name (default: the executable's name).")] = None,
        api: ApiOption = None,
        direct: Annotated[bool, typer.Option("--direct", help="Open the store directly, never the API.")] = False,
        as_json: Annotated[bool, typer.Option("--json", help="Print the results as JSON.")] = False,
    ) -> None:
        """Import Darshan logs (POSIX, MPI-IO, STDIO, LUSTRE counters; DXT requests). Idempotent."""
        console = Console(stderr=True)
        url = _api_url(api)
        try:
            results: list[dict[str, Any]] | None = None
            from pharos_core.settings import get_settings

            if not direct and not get_settings().clickhouse_url:
                results = _import_via_api(url, logs, job_id, name)
            if results is None:
                results = _import_direct(logs, job_id, name, console)
        except ApiError as exc:
            _fail(str(exc))
        if as_json:
            typer.echo(json.dumps(results, indent=2))
        else:
            out = Console()
            for r in results:
                style = {"imported": "green", "skipped": "yellow", "failed": "red"}[r["status"]]
                line = Text.assemble((r["status"].ljust(8), style), f" {Path(r['path']).name}")
                if r["job_id"]:
                    line.append(f" -> job {r['job_id']}")
                if r["status"] == "imported":
                    line.append(
                        f" ({r['dxt_segments']} DXT requests, {r['counter_rows']} counters"
                        + (f", ranks {r['rank_offset']}..{r['rank_offset'] + r['ranks'] - 1}" if r["ranks"] else "")
                        + ")"
                    )
                out.print(line)
                for w in r["warnings"]:
                    out.print(Text(f"         warning: {w}", style="yellow"))
                if r["error"]:
                    out.print(Text(f"         error: {r['error']}", style="red"))
            n = {s: sum(1 for r in results if r["status"] == s) for s in ("imported", "skipped", "failed")}
            out.print(f"{n['imported']} imported, {n['skipped']} skipped (already stored), {n['failed']} failed")
        if any(r["status"] == "failed" for r in results):
            raise typer.Exit(1)
