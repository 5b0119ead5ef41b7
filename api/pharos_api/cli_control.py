"""``pharos hint`` and ``pharos control ...``: the control loop over HTTP.

* ``pharos hint JOB`` (or ``--name/--user/--command`` for a job not started yet): the DFRA
  decision, i.e. which forwarding nodes and why; reading it changes nothing (``GET
  /v1/hints/jobs/{id}``). ``--claim`` (and ``--apply``, which also pushes the mapping) takes
  and records it, holding reserved nodes (``POST``; an admin or scheduler token).
* ``pharos control actions``: the audit trail (decisions, pushes, failures).
* ``pharos control pins``, ``pharos control pin job JOB NODE...``, ``pharos control pin pool
  POOL TARGET... [--max-perf ost0=50]``, ``pharos control unpin job|pool NAME``.
* ``pharos control migrations [--unfinished]``: the online migrations off fail-slow targets, per
  daemon (state, source -> destination, progress, bytes left, allocated and achieved MB/s) and
  the loop's plannings; ``pharos control migration-set NODE ID [--pin|--unpin] [--priority N]
  [--min-mb-s X] [--max-mb-s Y]`` and ``pharos control migration-cancel NODE ID`` (admin).

Like ``pharos jobs``, these ask the API (``--api URL``, ``PHAROS_API_URL``, else
``Settings.api_url``) and never open the store; ``--json`` prints the API's JSON; errors are
one line on stderr and exit code 1.
"""

from __future__ import annotations

import json
import shlex
from typing import Annotated, Any
from urllib.parse import quote

import httpx
import typer
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from .cli_jobs import ApiError, ApiOption, JsonOption, _api_url, _fail, api_request, show

_CLASS = {"default": "", "more_nodes": "bold cyan", "dedicated": "bold magenta"}
_STATUS = {"applied": "green", "failed": "bold red", "recorded": "yellow"}


def api_call(api_url: str, method: str, path: str, body: Any = None) -> httpx.Response:
    """PUT/DELETE ``api_url + path`` with the API token; a 2xx response, else :class:`ApiError` (one line)."""
    return api_request(api_url, method, path, json=body)


def _pin_call(api: str | None, method: str, scope: str, name: str, body: Any = None) -> None:
    """PUT/DELETE ``/v1/control/pins/{scope}/{name}``; an API error is one line on stderr and exit code 1."""
    try:
        api_call(_api_url(api), method, f"/v1/control/pins/{scope}/{quote(name, safe='')}", body)
    except ApiError as exc:
        _fail(str(exc))


#: How a job asks for node-local mode (agents/slurm/pharos_spank.c, ``pharos run``), MOUNT a pharos-mount.
NODE_LOCAL_HOW = "srun --pharos-node-local=MOUNT / pharos run --node-local MOUNT"


def render_hint(console: Console, h: dict) -> None:
    """A hint (``GET /v1/hints...``): class and nodes, why, the Beacon/DFRA criteria, node-local
    mode when suggested (its reason from ``evidence["node_local"]`` and how to ask for it),
    pins, remaps, push status."""
    who = f"job {h['job_id']}" if h["job_id"] else "a new job"
    console.print(
        Text.assemble(
            f"{who}: ",
            (h["class"].replace("_", " "), _CLASS.get(h["class"], "")),
            " → forwarding node(s) ",
            (", ".join(h["nodes"]) or "(mount default)", "bold"),
            f"  (dedicated: {', '.join(h['reserved'])})" if h.get("reserved") else "",
        )
    )
    console.print(Text(f"  why: {h['reason']}"))
    crit = (h.get("evidence") or {}).get("criteria") or {}
    if crit:
        t = Table("criterion (Beacon/DFRA)", "value", "needed", "ok", box=box.SIMPLE_HEAD, pad_edge=False)
        for k, c in crit.items():
            t.add_row(k, str(c["value"]), str(c["need"]), Text("yes", "green") if c["ok"] else Text("no", "red"))
        console.print(t)
    if h.get("node_local"):
        why = ((h.get("evidence") or {}).get("node_local") or {}).get("reason", "")
        console.print(Text(f"  node-local: suggested ({why}): {NODE_LOCAL_HOW}", "bold cyan"))
    if h.get("pinned"):
        console.print(f"  [yellow]pinned by an admin to {', '.join(h['pinned'])}[/yellow]")
    cur = h.get("current_nodes")
    if cur and cur != h["nodes"]:
        console.print(f"  now on {', '.join(cur)} (remapped live)")
    if h.get("status"):
        console.print(Text(f"  push: {h['status']} {h.get('error') or ''}".rstrip(), _STATUS.get(h["status"], "")))
    if h.get("dry_run"):
        console.print("  [yellow]control loop in dry-run: nothing is pushed[/yellow]")


def actions_table(data: dict) -> Table:
    t = Table(title="control actions (newest first)", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    for c in ("time (UTC)", "kind", "job / resource", "from → to", "status", "reason"):
        t.add_column(c, no_wrap=c not in ("reason", "from → to"))
    for a in data["items"]:
        status = Text(a["status"] + (" (dry-run)" if a["dry_run"] else ""), _STATUS.get(a["status"], ""))
        reason = a["reason"] + (f" [error: {a['error']}]" if a["error"] else "")
        t.add_row(
            a["time"].replace("T", " ")[:19],
            a["kind"],
            a["job_id"] or a["resource"],
            f"{a['from_state'] or '-'} → {a['to_state'] or '-'}",
            status,
            reason,
        )
    return t


def pins_table(data: dict) -> Table:
    t = Table("scope", "name", "pinned to", "reason", title="pins", title_justify="left", box=box.SIMPLE_HEAD)
    for p in data["items"]:
        v = p["value"]
        shown = ", ".join(v) if isinstance(v, list) else json.dumps(v)
        t.add_row(p["scope"], p["name"], shown, p["reason"] or "-")
    return t


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


_STATE = {"done": "green", "failed": "bold red", "cancelled": "yellow", "copying": "cyan", "deferred": "magenta"}


def render_migrations(console: Console, data: dict) -> None:
    """Per daemon a table of its tasks (progress, bytes left, MB/s), then the loop's plannings."""
    for d in data["daemons"]:
        if not d["ok"]:
            console.print(Text(f"{d['daemon']}: not answering ({d['error']})", "bold red"))
            continue
        st = d.get("settings") or {}
        states = ", ".join(f"{n} {k}" for k, n in sorted(d["states"].items())) or "no task"
        title = (
            f"{d['daemon']}: {states}; {_size(d['bytes_left'])} left; cap {st.get('max_total_mb_s', '?')} MB/s, "
            f"{st.get('max_active', '?')} at once" + (" (minimums scaled down)" if d["minimums_scaled"] else "")
        )
        t = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
        for c in ("id", "state", "file", "from → to", "progress", "left", "MB/s now", "achieved", "prio/min"):
            t.add_column(
                c, no_wrap=c != "file", justify="right" if c in ("id", "left", "MB/s now", "achieved") else "left"
            )
        for k in d["tasks"]:
            total = k["bytes_done"] + k["bytes_left"]
            pct = 100.0 if k["state"] == "done" else (100.0 * k["bytes_done"] / total if total else 0.0)
            state = k["state"] + (" (pinned)" if k.get("pinned") else "")
            t.add_row(
                str(k["id"]),
                Text(state + (f": {k['error']}" if k.get("error") else ""), _STATE.get(k["state"], "")),
                k["path"],
                f"{k['source_target']} → {k.get('dest_target') or '?'}",
                f"{pct:5.1f} %",
                _size(k["bytes_left"]),
                f"{k['rate_mb_s']:.1f}",
                f"{k['achieved_mb_s']:.1f}",
                f"{k['priority']}/{k['min_mb_s']:g}",
            )
        console.print(t)
    planned = Table(
        "time (UTC)", "target", "daemon: tasks", "status", "reason", title="loop's plannings", title_justify="left"
    )
    planned.box = box.SIMPLE_HEAD
    for a in data["planned"]:
        status = Text(a["status"] + (" (dry-run)" if a["dry_run"] else ""), _STATUS.get(a["status"], ""))
        reason = a["reason"] + (f" [error: {a['error']}]" if a["error"] else "")
        planned.add_row(a["time"].replace("T", " ")[:19], a["from_state"], a["to_state"] or "-", status, reason)
    console.print(planned)
    if not data["enabled"]:
        console.print("[yellow]migration planning is off ([control] migration_enabled)[/yellow]")
    if data["dry_run"]:
        console.print("[yellow]control loop in dry-run: nothing is posted[/yellow]")


def _max_perf(items: list[str]) -> dict[str, float]:
    out = {}
    for it in items:
        t, sep, v = it.partition("=")
        try:
            out[t] = float(v)
        except ValueError:
            sep = ""
        if not sep or not t:
            _fail(f"--max-perf {it!r}: expected TARGET=MB_S, e.g. ost0=50")
    return out


def register(app: typer.Typer) -> None:
    """Add ``hint`` and the ``control`` group (actions, pins, pin, unpin) to ``app``."""
    control = typer.Typer(
        help="The control loop: DFRA allocation, live remapping, placement hints (audit and pins).",
        no_args_is_help=True,
    )
    pin = typer.Typer(help="Pin a job's forwarding nodes or a placement pool: the loop never changes them.")
    unpin = typer.Typer(help="Remove a pin.")
    control.add_typer(pin, name="pin")
    control.add_typer(unpin, name="unpin")
    app.add_typer(control, name="control")

    @app.command("hint")
    def hint_cmd(
        job: Annotated[str | None, typer.Argument(help="Job id (its recorded decision, else a preview).")] = None,
        name: Annotated[str | None, typer.Option(help="Job name (for a job that has not started).")] = None,
        user: Annotated[str | None, typer.Option(help="User (with --name).")] = None,
        command: Annotated[str | None, typer.Option(help="Command line (with --name), e.g. 'fio job.fio'.")] = None,
        claim: Annotated[
            bool, typer.Option("--claim", help="Take and record the decision, holding reserved nodes (JOB only).")
        ] = False,
        apply: Annotated[
            bool, typer.Option("--apply", help="Claim, and push the mapping to the mounts now (JOB only).")
        ] = False,
        api: ApiOption = None,
        as_json: JsonOption = False,
    ) -> None:
        """DFRA decision for a job: which forwarding nodes (default, more, dedicated) and why."""
        if job is None and not name:
            _fail("give a JOB id, or --name (and --user, --command) for a job not started yet")
        params: dict[str, Any] = {}
        if name:
            params["name"] = name
        if user:
            params["user"] = user
        if command:
            params["command"] = shlex.split(command)
        if job is None:
            show(_api_url(api), "/v1/hints", params, as_json=as_json, render_to=render_hint)
            return
        path = f"/v1/hints/jobs/{quote(job, safe='')}"
        if not (claim or apply):
            show(_api_url(api), path, params, as_json=as_json, render_to=render_hint)
            return
        try:
            r = api_request(_api_url(api), "POST", path, params=params | {"apply": str(apply).lower()})
        except ApiError as exc:
            _fail(str(exc))
        if as_json:
            typer.echo(r.text)
        else:
            render_hint(Console(), r.json())

    @control.command("actions")
    def actions_cmd(
        job: Annotated[str | None, typer.Option(help="Only this job's actions.")] = None,
        kind: Annotated[
            str | None,
            typer.Option(
                help="dfra_default | dfra_more_nodes | dfra_dedicated | remap | release | lease_expired | placement | "
                "sync | pin | unpin"
            ),
        ] = None,
        since: Annotated[float, typer.Option(help="Recorded in the last SECONDS.", min=1)] = 86400.0,
        limit: Annotated[int, typer.Option(help="At most this many rows.", min=1, max=10000)] = 100,
        api: ApiOption = None,
        as_json: JsonOption = False,
    ) -> None:
        """Every decision and push of the control loop, applied, failed (and why) or recorded."""
        params: dict[str, Any] = {"since_s": since, "limit": limit}
        params |= {k: v for k, v in (("job", job), ("kind", kind)) if v}
        show(_api_url(api), "/v1/control/actions", params, as_json=as_json, render=actions_table)

    @control.command("pins")
    def pins_cmd(api: ApiOption = None, as_json: JsonOption = False) -> None:
        """Admins' pins of jobs and pools."""
        show(_api_url(api), "/v1/control/pins", as_json=as_json, render=pins_table)

    @control.command("migrations")
    def migrations_cmd(
        unfinished: Annotated[bool, typer.Option("--unfinished", help="Only tasks not finished.")] = False,
        since: Annotated[float, typer.Option(help="Plannings of the last SECONDS.", min=1)] = 7 * 86400.0,
        api: ApiOption = None,
        as_json: JsonOption = False,
    ) -> None:
        """Online migrations off fail-slow targets: each daemon's tasks (progress, bytes left) and the loop's plannings."""
        params = {"since_s": since, "unfinished": str(unfinished).lower()}
        show(_api_url(api), "/v1/control/migrations", params, as_json=as_json, render_to=render_migrations)

    def _task_call(api: str | None, method: str, node: str, task: int, body: Any = None, params=None) -> dict:
        try:
            path = f"/v1/control/migrations/{quote(node, safe='')}/{task}"
            return api_request(_api_url(api), method, path, json=body, params=params).json()
        except ApiError as exc:
            _fail(str(exc))
            raise  # unreachable: _fail exits

    @control.command("migration-set")
    def migration_set(
        node: Annotated[str, typer.Argument(help="Forwarding node whose daemon runs the task.")],
        task: Annotated[int, typer.Argument(help="Task id (pharos control migrations).", min=0)],
        pin_it: Annotated[
            bool | None, typer.Option("--pin/--unpin", help="Keep the file where it is / let it move again.")
        ] = None,
        priority: Annotated[int | None, typer.Option(help="MODM priority (higher first).")] = None,
        min_mb_s: Annotated[float | None, typer.Option(help="Guaranteed MB/s.", min=0)] = None,
        max_mb_s: Annotated[float | None, typer.Option(help="Ceiling MB/s.")] = None,
        reason: Annotated[str, typer.Option(help="Why (kept in the audit trail).")] = "",
        api: ApiOption = None,
    ) -> None:
        """Pin, re-prioritise or re-rate migration task TASK of NODE (admin; recorded)."""
        body = {"pinned": pin_it, "priority": priority, "min_mb_s": min_mb_s, "max_mb_s": max_mb_s, "reason": reason}
        r = _task_call(api, "PUT", node, task, {k: v for k, v in body.items() if v is not None})
        typer.echo(f"migration {node}/{task}: {r['status']} {json.dumps(r['task']) if r['task'] else ''}".rstrip())

    @control.command("migration-cancel")
    def migration_cancel(
        node: Annotated[str, typer.Argument(help="Forwarding node whose daemon runs the task.")],
        task: Annotated[int, typer.Argument(help="Task id.", min=0)],
        reason: Annotated[str, typer.Option(help="Why (kept in the audit trail).")] = "",
        api: ApiOption = None,
    ) -> None:
        """Cancel migration task TASK of NODE (a copy under way is rolled back; admin; recorded)."""
        r = _task_call(api, "DELETE", node, task, params={"reason": reason} if reason else None)
        state = (r.get("task") or {}).get("state", "")
        typer.echo(f"migration {node}/{task}: {r['status']}" + (f", {state}" if state else ""))

    @pin.command("job")
    def pin_job(
        job: Annotated[str, typer.Argument(help="Job id.")],
        nodes: Annotated[list[str], typer.Argument(help="Forwarding nodes, primary first.")],
        reason: Annotated[str, typer.Option(help="Why (kept in the audit trail).")] = "",
        api: ApiOption = None,
    ) -> None:
        """Pin JOB to forwarding NODES: the loop neither allocates nor remaps it."""
        _pin_call(api, "PUT", "jobs", job, {"nodes": nodes, "reason": reason})
        typer.echo(f"job {job} pinned to {', '.join(nodes)}")

    @pin.command("pool")
    def pin_pool(
        pool: Annotated[str, typer.Argument(help="Pool name (the loop's is [control] placement_pool, 'pharos').")],
        targets: Annotated[list[str], typer.Argument(help="Targets of the pool.")],
        max_perf: Annotated[
            list[str] | None, typer.Option("--max-perf", help="TARGET=MB_S (repeatable): the pool's max_perf.")
        ] = None,
        reason: Annotated[str, typer.Option(help="Why (kept in the audit trail).")] = "",
        api: ApiOption = None,
    ) -> None:
        """Pin placement POOL to TARGETS (and their max_perf) as given."""
        body = {"targets": targets, "max_perf": _max_perf(max_perf or []), "reason": reason}
        _pin_call(api, "PUT", "pools", pool, body)
        typer.echo(f"pool {pool} pinned to {', '.join(targets)}")

    @unpin.command("job")
    def unpin_job(job: Annotated[str, typer.Argument(help="Job id.")], api: ApiOption = None) -> None:
        """Remove JOB's pin: the loop manages it again."""
        _pin_call(api, "DELETE", "jobs", job)
        typer.echo(f"job {job} unpinned")

    @unpin.command("pool")
    def unpin_pool(pool: Annotated[str, typer.Argument(help="Pool name.")], api: ApiOption = None) -> None:
        """Remove POOL's pin: the loop manages it again."""
        _pin_call(api, "DELETE", "pools", pool)
        typer.echo(f"pool {pool} unpinned")
