"""``pharos jobs`` and ``pharos job ID``: the job list and a job's I/O report, over HTTP.

The CLI never opens the store (chDB allows one process per data directory): it asks the
API that ``pharos up`` serves. The base URL is ``--api URL``, else ``PHAROS_API_URL``, else,
when no token is configured and the API's Unix socket exists (``api_socket``, default
``<state_dir>/api.sock``: the API host), ``unix:<socket>``, where the server knows the caller
by uid; else ``Settings.api_url`` (http://127.0.0.1:8400) (:func:`pharos_core.api_client.client_url`).
``--api unix:/path/api.sock`` names a socket explicitly. When the API does not answer, the
commands print one error line to stderr and exit with code 1.

Every request carries the API token, when there is one (:func:`api_headers`): ``pharos --token
TOKEN ...``, else ``PHAROS_API_TOKEN``, else the settings' ``api_token`` / ``api_token_file``
(docs/security.md).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from enum import Enum
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote

import httpx
import typer
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from pharos_analytics.summary_sql import LAYERS
from pharos_core import api_client

Layer = Enum("Layer", {name: name for name in LAYERS}, type=str)

BAR_WIDTH = 30

ApiOption = Annotated[
    str | None,
    typer.Option(
        "--api",
        envvar="PHAROS_API_URL",
        help="Base URL of the Pharos API, http://HOST:PORT or unix:SOCKET (default: the API's Unix socket when it "
        "exists here and no token is given, else Settings.api_url, http://127.0.0.1:8400).",
        show_default=False,
    ),
]

#: ``--json``: print the API's JSON instead of the table.
JsonOption = Annotated[bool, typer.Option("--json", help="Print the API's JSON.")]


class ApiError(Exception):
    """The API was unreachable or answered with an error; the message is one line for the user."""


#: The token given as ``pharos --token`` (wins over the environment and the settings).
TOKEN_OVERRIDE: str | None = None


def api_token() -> str:
    """The API token the CLI sends: ``pharos --token``, else ``PHAROS_API_TOKEN``, else the
    settings (``api_token``, ``api_token_file``); '' when none. Raises ApiError when the token
    file cannot be read."""
    if TOKEN_OVERRIDE:
        return TOKEN_OVERRIDE.strip()
    env = os.environ.get("PHAROS_API_TOKEN", "").strip()
    if env:
        return env
    from pharos_core.settings import get_settings

    try:
        return get_settings().api_token_value()
    except OSError as exc:
        raise ApiError(f"cannot read the API token file (api_token_file): {exc}") from None


def api_headers() -> dict[str, str]:
    """``{"Authorization": "Bearer <token>"}`` when there is a token (:func:`api_token`), else ``{}``."""
    token = api_token()
    return {"Authorization": f"Bearer {token}"} if token else {}


def api_error(r: httpx.Response) -> ApiError:
    """A one-line ApiError from an error response (its ``detail``; a hint for 401 and 403)."""
    try:
        detail = r.json().get("detail", r.text)
    except (ValueError, AttributeError):
        detail = r.text
    if not isinstance(detail, str):
        detail = json.dumps(detail)
    if r.status_code == 401:
        detail += (
            " (give a token: pharos --token TOKEN, PHAROS_API_TOKEN or api_token_file; or, on the API host, no URL "
            "and no token: the CLI then uses the API's Unix socket (api_socket); docs/security.md)"
        )
    return ApiError(f"Pharos API error {r.status_code}: {detail}")


def api_request(api_url: str, method: str, path: str, *, timeout: float | None = None, **kwargs: Any) -> httpx.Response:
    """``method`` ``api_url + path`` with the API token (``kwargs`` go to httpx: params, json,
    content, headers), waiting at most ``timeout`` s (default: the ``api_timeout_s`` setting,
    PHAROS_API_TIMEOUT_S); a 2xx response, else :class:`ApiError` with a one-line message."""
    headers = api_headers() | kwargs.pop("headers", {})
    if timeout is None:
        from pharos_core.settings import get_settings

        timeout = get_settings().api_timeout_s
    try:
        r = api_client.request(api_url, method, path, headers=headers, timeout=timeout, **kwargs)
    except httpx.TimeoutException:
        raise ApiError(
            f"Pharos API at {api_url} did not answer {method} {path} within {timeout:g} s "
            "(a busy store; wait longer with PHAROS_API_TIMEOUT_S or api_timeout_s in pharos.toml)"
        ) from None
    except httpx.TransportError:
        raise ApiError(f"Pharos API not reachable at {api_url}: start it with `pharos up`") from None
    if r.status_code >= 400:
        raise api_error(r)
    return r


def _api_url(api: str | None) -> str:
    """The base URL of the CLI's requests: ``api`` (``--api``, PHAROS_API_URL) when given, else
    :func:`pharos_core.api_client.client_url` (the Unix socket on the API host without a token,
    else the TCP URL)."""
    if api:
        return api.rstrip("/")
    from pharos_core.settings import get_settings

    if TOKEN_OVERRIDE:
        return get_settings().api_url
    return api_client.client_url(get_settings())


def api_get(
    api_url: str, path: str, params: dict[str, Any] | None = None, timeout: float | None = None
) -> httpx.Response:
    """GET ``api_url + path`` (``timeout`` s, default ``api_timeout_s``) with the API token; a 2xx response, else
    :class:`ApiError` with a one-line message."""
    return api_request(api_url, "GET", path, params=params, timeout=timeout)


def show(
    api_url: str,
    path: str,
    params: dict[str, Any] | None = None,
    *,
    as_json: bool,
    render: Callable[[Any], Any] | None = None,
    render_to: Callable[[Console, Any], None] | None = None,
) -> None:
    """GET ``path`` from the API and print it: the API's JSON with ``as_json``, else the rich
    renderable ``render(json)``, or what ``render_to(console, json)`` prints; an API error is one
    line on stderr and exit code 1."""
    try:
        r = api_get(api_url, path, params)
    except ApiError as exc:
        _fail(str(exc))
    if as_json:
        typer.echo(r.text)
        return
    if render_to is not None:
        render_to(Console(), r.json())
    else:
        Console().print(render(r.json()))


def _fail(msg: str) -> None:
    """Print ``msg`` as one line on stderr and exit with code 1."""
    typer.echo(msg.replace("\n", " "), err=True)
    raise typer.Exit(1)


def human_bytes(n: float | None) -> str:
    """1536 -> '1.5 KiB' (binary units)."""
    if n is None:
        return "-"
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{int(n)} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} PiB"  # pragma: no cover


def _time(iso: str | None) -> str:
    if not iso:
        return "-"
    return iso.replace("T", " ").split(".")[0].removesuffix("Z")


_STATE_STYLE = {"running": "yellow", "finished": "green", "failed": "red", "unknown": "dim"}


def _jobs_table(data: dict) -> Table:
    t = Table(
        title=f"jobs {data['offset'] + 1}-{data['offset'] + len(data['items'])} of {data['total']}",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
    )
    for col, kw in (
        ("job", {"no_wrap": True}),
        ("name", {"overflow": "ellipsis", "min_width": 6, "max_width": 10}),
        ("state", {"no_wrap": True}),
        ("ranks", {"justify": "right", "min_width": 5}),
        ("pattern", {"no_wrap": True}),
        ("written", {"justify": "right", "no_wrap": True}),
        ("read", {"justify": "right", "no_wrap": True}),
        ("start (UTC)", {"no_wrap": True}),
    ):
        t.add_column(col, **kw)
    for j in data["items"]:
        t.add_row(
            Text(j["job_id"]),
            Text(j["name"] or "-"),
            Text(j["state"], style=_STATE_STYLE.get(j["state"], "")),
            "-" if j["ranks"] is None else str(j["ranks"]),
            j["pattern"],
            human_bytes(j["bytes_written"]),
            human_bytes(j["bytes_read"]),
            _time(j["start"])[5:],  # MM-DD hh:mm:ss
        )
    return t


def render_job(console: Console, s: dict) -> None:
    """Print a job summary (the API's JSON) as a readable report."""
    state = Text(s["state"], style=_STATE_STYLE.get(s["state"], ""))
    head = Text.assemble(("job ", "bold"), (s["job_id"], "bold cyan"), "  ", state)  # Text: no markup
    if s["exit_code"] is not None:
        head.append(f" (exit {s['exit_code']})")
    console.print(head)
    _print_gaps(console, s)
    console.print(
        f"name {s['name'] or '-'}   user {s['user'] or '-'}   host {s['host'] or '-'}   layer {s['layer']}",
        markup=False,
    )
    if s["command"]:
        console.print(f"command {' '.join(s['command'])}", markup=False)
    console.print(f"start {_time(s['start'])}   end {_time(s['end'])} UTC")
    source = s.get("source", "traces")
    if source == "darshan-counters":  # a Darshan log imported without DXT
        console.print(f"source {source} (per-file totals; no per-request traces)", markup=False)
    elif source != "traces":  # a Darshan log with DXT: totals from the counters, DXT for the detail
        console.print(
            f"source {source} (totals from the module counters; DXT gives the per-request detail)", markup=False
        )
    if s.get("dxt"):
        from pharos_analytics.summary_dxt import dxt_text

        console.print(Text(dxt_text(s["dxt"]), style="yellow" if s["dxt"]["partial"] else ""))
    ranks = "-" if s["ranks"] is None else s["ranks"]
    console.print(
        f"[bold]pattern {s['pattern']}[/bold] (by volume: writes {s['patterns']['write']}, reads "
        f"{s['patterns']['read']}; all files together {s.get('fan_in_pattern', '-')})"
        f"   ranks {ranks} launched, {s['io_ranks']} did data I/O on {s['n_files']} file(s)"
    )
    if s.get("compute_nodes"):
        via = s.get("forwarding_nodes") or {}
        names = [f"{n} (via {'+'.join(via[n])})" if n in via else n for n in s["compute_nodes"]]
        console.print(f"compute nodes {len(names)}: {', '.join(names)}", markup=False)
    bw = "-" if s["bandwidth_mib_s"] is None else f"{s['bandwidth_mib_s']:.1f} MiB/s"
    span = "-" if s["io_span_s"] is None else f"{s['io_span_s']:.3f} s"
    console.print(
        f"written {human_bytes(s['bytes_written'])}   read {human_bytes(s['bytes_read'])}   "
        f"I/O span {span}   bandwidth {bw}   time in I/O {s['io_time_s']:.3f} s"
    )
    console.print(
        f"requests {s['requests']} in {s['records']} records   failed {s['failed_requests']}   "
        f"non-file {s['non_file_ops']['requests']} requests, {human_bytes(s['non_file_ops']['bytes'])}"
    )

    if s["ops"] or s["other_ops"]:
        ops = Table(title="operations (requests)", title_justify="left")
        ops.add_column("op")
        ops.add_column("requests", justify="right")
        for op, n in s["ops"].items():
            ops.add_row(op, str(n))
        for op, n in s["other_ops"].items():  # block layer, data ops on directories, ...
            ops.add_row(Text(f"{op} (other)" if op in s["ops"] else op, style="dim"), str(n))
        console.print(ops)

    hist = s["size_histogram"]
    if not any([*hist["read"].values(), *hist["write"].values()]):
        console.print("request sizes: no data requests")
    else:
        _print_histogram(console, hist)
    _print_files_and_drops(console, s)


def _print_gaps(console: Console, s: dict) -> None:
    """The coverage warning: the job ran while an agent on its hosts was silent (gaps)."""
    if s.get("complete", True):
        return
    from pharos_analytics.coverage import gap_lines

    silence = (s.get("coverage") or {}).get("silence_s", 0)
    console.print(
        Text(
            f"WARNING: INCOMPLETE: no live eBPF agent for part of this job ({len(s['gaps'])} gap(s) of more than "
            f"{silence:g} s without a batch or heartbeat); its figures are a lower bound",
            style="bold red",
        )
    )
    for line in gap_lines(s["gaps"]):
        console.print(Text("  " + line, style="red"))


def _print_histogram(console: Console, hist: dict) -> None:
    peak = max([*hist["read"].values(), *hist["write"].values(), 1])
    h = Table(title="request sizes (Darshan bins, requests)", title_justify="left")
    h.add_column("size")
    h.add_column("reads", justify="right")
    h.add_column("")
    h.add_column("writes", justify="right")
    h.add_column("")
    for label in hist["read"]:
        r, w = hist["read"][label], hist["write"].get(label, 0)

        def bar(n):
            return "█" * (max(1, round(n / peak * BAR_WIDTH)) if n else 0)

        h.add_row(label, str(r), Text(bar(r), style="blue"), str(w), Text(bar(w), style="magenta"))
    console.print(h)


def _print_files_and_drops(console: Console, s: dict) -> None:
    if s["files"]:
        f = Table(title=f"files ({len(s['files'])} of {s['n_files']})", title_justify="left")
        f.add_column("path", overflow="fold")
        f.add_column("written", justify="right")
        f.add_column("read", justify="right")
        f.add_column("ranks", justify="right")
        for x in s["files"]:
            f.add_row(Text(x["path"]), human_bytes(x["bytes_written"]), human_bytes(x["bytes_read"]), str(x["ranks"]))
        console.print(f)
    else:
        console.print("files: none")

    d = s["drops"]
    style = "red" if s["dropped_records"] else "green"
    console.print(
        f"[{style}]dropped records {s['dropped_records']}[/{style}] (ring buffer {d['ringbuf_drops']}, "
        f"delivery {d['delivery_failures']}, overflow {d['overflow_drops']}; "
        f"{d['producers']} producer(s); unmerged fallbacks {d['unmerged_fallbacks']})"
    )


def register(app: typer.Typer) -> None:
    """Add the ``jobs`` and ``job`` commands to ``app``."""

    @app.command("jobs")
    def jobs_cmd(
        api: ApiOption = None,
        limit: Annotated[int, typer.Option(min=1, max=1000, help="Jobs per page.")] = 50,
        offset: Annotated[int, typer.Option(min=0, help="Jobs to skip.")] = 0,
        layer: Annotated[Layer, typer.Option(help="Layer whose I/O gives bytes and pattern.")] = Layer.client,
        as_json: JsonOption = False,
    ) -> None:
        """List jobs, newest first: state, ranks, I/O pattern, bytes."""
        url = _api_url(api)
        params = {"limit": limit, "offset": offset, "layer": layer.value}
        show(url, "/v1/jobs", params, as_json=as_json, render=_jobs_table)

    @app.command("report")
    def report_cmd(
        job_id: Annotated[str, typer.Argument(help="Job id.")],
        html_out: Annotated[
            Path, typer.Option("--html", help="Write the report, one self-contained HTML page, to this file.")
        ],
        api: ApiOption = None,
    ) -> None:
        """A job's visual report: diagnosis in plain words, rank x time heat map, bandwidth over
        time with phases, request sizes, files and targets (GET /v1/jobs/{id}/report)."""
        url = _api_url(api)
        try:
            r = api_get(url, f"/v1/jobs/{quote(job_id, safe='')}/report", timeout=300.0)
            html_out.write_text(r.text)
        except (ApiError, OSError) as exc:
            _fail(f"pharos report: {exc}")
        typer.echo(f"report of job {job_id} written to {html_out} ({len(r.text) / 1024:.0f} KiB)")

    @app.command("job")
    def job_cmd(
        job_id: Annotated[str, typer.Argument(help="Job id.")],
        api: ApiOption = None,
        layer: Annotated[Layer, typer.Option(help="Layer to summarise.")] = Layer.client,
        as_json: JsonOption = False,
    ) -> None:
        """A job's I/O report: pattern, bytes, operations, request sizes, files, drops."""
        path = f"/v1/jobs/{quote(job_id, safe='')}"
        show(_api_url(api), path, {"layer": layer.value}, as_json=as_json, render_to=render_job)
