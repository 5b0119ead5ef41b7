"""``pharos anomalies``, ``pharos targets``, ``pharos forwarders``: system-side diagnosis over HTTP.

Like ``pharos jobs``, these ask the API (``--api URL``, ``PHAROS_API_URL``, else
``Settings.api_url``) and never open the store; ``--json`` prints the API's JSON.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

import typer
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from pharos_analytics.failslow import stall_added_ms
from pharos_analytics.straggler import ANOMALY_KIND as STRAGGLER_KIND

from .cli_jobs import ApiOption, JsonOption, _api_url, human_bytes, show

_SEV = {"critical": "bold red", "warning": "yellow"}


def _ms(ns: float | None) -> str:
    return "-" if ns is None else f"{float(ns) / 1e6:.1f}"


def _rate(b: float | None) -> str:
    return "-" if b is None else human_bytes(b) + "/s"


def _state(item: dict) -> Text:
    fs = item.get("fail_slow")
    if not fs:
        return Text("ok", style="green")
    how = _stall(fs.get("stall_added_ms")) or f"{float(fs['ratio'] or 0):.1f}x"
    return Text(f"FAIL-SLOW {fs['persistence']} {how}", style=_SEV.get(fs["severity"], "red"))


def _stall(added_ms: float | None) -> str | None:
    """A forwarding node named by its waits (a stall): its service ratio says nothing (~1x)."""
    return None if added_ms is None else f"stall +{float(added_ms):.0f} ms wait"


def anomalies_table(data: dict) -> Table:
    t = Table(
        title=f"anomalies ({data['source']}, as of {data.get('as_of') or '-'})",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
    )
    for c in ("kind", "node / resource", "job <- culprit", "state", "severity", "ratio", "onset (UTC)"):
        t.add_column(c, no_wrap=c != "job <- culprit")
    for a in data["items"]:
        job = a.get("job_id") or "-"
        if a.get("culprit_job"):
            job += f" <- {a['culprit_job']}"
        if a["kind"] == STRAGGLER_KIND:  # evidence from one job's own I/O, not a live condition
            state = "job evidence"
        else:
            state = ("active" if a["active"] else "cleared") + (f" {a['persistence']}" if a.get("persistence") else "")
        ratio = a.get("ratio", a.get("rel_service", a.get("latency_ratio")))
        stall = _stall(stall_added_ms(a["evidence"])) if isinstance(a.get("evidence"), dict) else None
        t.add_row(
            a["kind"],
            a.get("node") or "-",
            job,
            state,
            Text(a["severity"], style=_SEV.get(a["severity"], "")),
            stall or ("-" if ratio is None else f"{float(ratio):.1f}x"),
            (a.get("onset") or "-").replace("T", " ")[:19],
        )
    return t


def _window_table(what: str, data: dict, columns: tuple[str, ...], left: tuple[str, ...], wrap: str = "") -> Table:
    """The table of ``GET /v1/targets`` or ``/v1/forwarders``: title with the window and the state
    source; ``columns`` right-justified but those in ``left``, none wrapped but ``wrap``."""
    t = Table(
        title=f"{what} (last {data['window_s']:g} s to {data['until'] or '-'}, state: {data['state_source']})",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
    )
    for c in columns:
        t.add_column(c, justify="right" if c not in left else "left", no_wrap=c != wrap)
    return t


def targets_table(data: dict) -> Table:
    cols = ("target", "bandwidth", "limit MB/s", "p50 ms", "p99 ms", "queue", "fault", "state")
    t = _window_table("storage targets", data, cols, left=("target", "state", "fault"))
    for x in data["items"]:
        f = x["faults"]
        fault = (
            ", ".join(
                s
                for s in (
                    f"slowdown {f['slowdown']:g}x" if f["slowdown"] > 1 else "",
                    f"+{f['added_latency_ns'] / 1e6:g} ms" if f["added_latency_ns"] else "",
                )
                if s
            )
            or "-"
        )
        lim = x["limits"]["max_perf_mb_s"]
        t.add_row(
            x["target"],
            _rate(x["bandwidth_b_s"]),
            f"{lim:g}" if lim else "-",
            _ms(x["latency_p50_ns"]),
            _ms(x["latency_p99_ns"]),
            f"{x['queue_depth']:.1f}",
            fault,
            _state(x),
        )
    return t


def forwarders_table(data: dict) -> Table:
    cols = ("node", "bandwidth", "requests", "wait ms", "service ms", "jobs", "state")
    t = _window_table("forwarding nodes", data, cols, left=("node", "jobs", "state"), wrap="jobs")
    for x in data["items"]:
        jobs = ", ".join(j["job_id"] for j in x["jobs"][:3]) + (f" +{len(x['jobs']) - 3}" if len(x["jobs"]) > 3 else "")
        t.add_row(
            x["node"],
            _rate(x["bandwidth_b_s"]),
            str(x["requests"]),
            _ms(x["queue_wait_ns"]),
            _ms(x["service_ns"]),
            jobs or "-",
            _state(x),
        )
    return t


def render_interference(console: Console, d: dict) -> None:
    """The interference part of ``pharos diagnose``: one line per event."""
    if not d.get("events"):
        shared = sum(1 for w in d.get("shared_windows", []) if w["shared"])
        if d.get("shared_windows"):
            console.print(
                f"[green]interference: none[/green] ({shared} of {len(d['shared_windows'])} "
                f"{d['window_s']:g} s windows shared a forwarding node or target)"
            )
        return
    console.print(f"[bold]interference[/bold] ({len(d['events'])}):")
    for e in d["events"]:
        console.print(
            Text.assemble(
                ("  " + e["severity"].upper().ljust(8), _SEV.get(e["severity"], "")),
                f" slowed {e['latency_ratio']:.1f}x by job ",
                (e["culprit_job"], "bold"),
                f" on {e['resource_type'].replace('_', ' ')} {e['resource']}",
            )
        )
        console.print(
            Text(
                f"           {e['windows']} x {d['window_s']:g} s from {(e.get('start') or '')[:19]}: latency "
                f"{e['baseline_latency_ms']:.2f} -> {e['latency_ms']:.2f} ms/request, queue wait "
                f"{e['baseline_queue_wait_ms']:.2f} -> {e['queue_wait_ms']:.2f} ms (baseline: "
                f"{e['baseline_source']}); culprit moved {human_bytes(e['culprit_bytes'])} there"
            )
        )


def register(app: typer.Typer) -> None:
    """Add ``anomalies``, ``targets`` and ``forwarders`` to ``app``."""

    @app.command("anomalies")
    def anomalies_cmd(
        api: ApiOption = None,
        kind: Annotated[str | None, typer.Option(help="fail_slow_target | fail_slow_forwarder | interference")] = None,
        node: Annotated[str | None, typer.Option(help="Target, forwarding node or shared resource.")] = None,
        job: Annotated[str | None, typer.Option(help="Interference of (or caused by) this job.")] = None,
        active: Annotated[
            bool | None, typer.Option("--active/--cleared", help="Only active, or only cleared.", show_default=False)
        ] = None,
        since: Annotated[float, typer.Option(help="Recent: detected in the last SECONDS.")] = 3600.0,
        live: Annotated[
            bool, typer.Option("--live", help="Detect now instead of reading the server's detector.")
        ] = False,
        as_json: JsonOption = False,
    ) -> None:
        """Fail-slow targets and forwarding nodes, interfering jobs: current and recent."""
        params = {"since_s": since, "live": str(live).lower()}
        params |= {k: v for k, v in (("kind", kind), ("node", node), ("job", job)) if v}
        if active is not None:
            params["active"] = str(active).lower()
        show(_api_url(api), "/v1/anomalies", params, as_json=as_json, render=anomalies_table)

    def status_command(name: str, path: str, render: Callable[[dict], Table], doc: str) -> None:
        """``pharos NAME [--window S] [--json]``: GET ``path`` over the window and print it."""

        def cmd(
            api: ApiOption = None,
            window: Annotated[
                float | None, typer.Option(help="Look-back in seconds (default: [diagnosis] status_window_s).")
            ] = None,
            as_json: JsonOption = False,
        ) -> None:
            show(_api_url(api), path, {"window_s": window} if window else None, as_json=as_json, render=render)

        cmd.__doc__ = doc
        app.command(name)(cmd)

    status_command(
        "targets",
        "/v1/targets",
        targets_table,
        "Storage targets: recent bandwidth, latency, limits, injected faults, fail-slow state.",
    )
    status_command(
        "forwarders",
        "/v1/forwarders",
        forwarders_table,
        "Forwarding nodes: recent load, queue wait, service time, jobs, fail-slow state.",
    )
