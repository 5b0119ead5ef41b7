"""``pharos slurm ...``: the site side of the Slurm integration (agents/slurm, docs/slurm.md).

* ``pharos slurm classes [--out FILE]``: the predicted I/O class of each (user, job name) with
  history and whether node-local mode is suggested (``GET /v1/hints/classes``), as a table or as
  the tab-separated file the ``job_submit.lua`` reads (written atomically: a temporary file
  renamed over FILE).
* ``pharos slurm status [--statedir DIR]``: the SPANK plugin's counters on this node (events
  sent/failed, spooled/resent/dropped, hints applied/skipped, tasks placed/unplaced/left in
  Slurm's cgroup) and its spool's backlog: how many jobs ran without their hint because the API
  was down, and how many of their events are still to be sent.
* ``pharos slurm config``: the plugstack.conf and slurm.conf lines for this installation.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from .cli_jobs import ApiError, ApiOption, JsonOption, _api_url, _fail, api_get, show

#: Where the plugin keeps its counters and ``pharos slurm classes`` its table, by default.
STATE_DIR = Path("/var/lib/pharos/slurm")
PLUGIN = Path(__file__).resolve().parents[2] / "build" / "slurm" / "pharos_spank.so"
JOB_SUBMIT_LUA = Path(__file__).resolve().parents[2] / "agents" / "slurm" / "job_submit.lua"
#: The plugin's counters (agents/slurm/pharos_spank.c, COUNTERS), in its order.
COUNTERS = (
    "events_sent",
    "events_failed",
    "spooled",
    "resent",
    "dropped",
    "hints_applied",
    "hints_skipped",
    "tasks_placed",
    "tasks_unplaced",
    "tasks_in_slurm_cgroup",
)


def read_counters(statedir: Path) -> dict[str, int]:
    """The plugin's counters (``<statedir>/counters``: ``name value`` lines); zeros when the
    plugin has not run yet. Raises OSError when the file exists but cannot be read."""
    out = dict.fromkeys(COUNTERS, 0)
    path = statedir / "counters"
    if not path.exists():
        return out
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] in out and parts[1].lstrip("-").isdigit():
            out[parts[0]] = int(parts[1])
    return out


def spool_pending(statedir: Path) -> int | None:
    """Job events waiting in the plugin's spool (``<statedir>/spool/*.json``, root-only: None when
    it cannot be read); 0 when there is no spool."""
    spool = statedir / "spool"
    try:
        return sum(1 for p in spool.iterdir() if p.suffix == ".json" and not p.name.startswith("."))
    except FileNotFoundError:
        return 0
    except OSError:
        return None


def classes_tsv(items: list[dict]) -> str:
    """The job_submit.lua table: a comment line, then user, name, class, pattern, runs, node_local
    (``yes``: node-local mode suggested, else ``no``) per line (tabs and newlines inside names
    replaced by spaces). An item without ``node_local`` (an API before it) gets ``no``."""

    def clean(x) -> str:
        return str(x).replace("\t", " ").replace("\n", " ")

    lines = ["# user\tname\tclass\tpattern\truns\tnode_local (pharos slurm classes)"]
    lines += [
        "\t".join([*(clean(i[k]) for k in ("user", "name", "class", "pattern", "runs")), yes_no(i.get("node_local"))])
        for i in items
    ]
    return "\n".join(lines) + "\n"


def yes_no(x) -> str:
    return "yes" if x else "no"


def write_atomically(path: Path, text: str) -> None:
    """Write ``text`` to a temporary file in ``path``'s directory and rename it over ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def register(app: typer.Typer) -> None:
    """Add the ``slurm`` group (classes, status, config) to ``app``."""
    slurm = typer.Typer(help="Slurm integration: I/O classes for job_submit.lua, the SPANK plugin's counters, set-up.")
    app.add_typer(slurm, name="slurm", no_args_is_help=True)

    @slurm.command("classes")
    def classes(
        api: ApiOption = None,
        out: Annotated[
            Path | None,
            typer.Option("--out", help="Write the table job_submit.lua reads (tab-separated) to this file."),
        ] = None,
        since_s: Annotated[float, typer.Option(min=1, help="History of the last seconds.")] = 30 * 86400.0,
        as_json: JsonOption = False,
    ) -> None:
        """Predicted I/O class (DFRA: default, more_nodes, dedicated) of each user's job names, and
        whether node-local mode is suggested."""
        url = _api_url(api)
        params = {"since_s": since_s}
        if out is None:

            def render(doc: dict) -> Table:
                t = Table("user", "job name", "class", "pattern", "runs", "node-local", title="Predicted I/O classes")
                for i in doc["items"]:
                    t.add_row(
                        i["user"], i["name"], i["class"], i["pattern"], str(i["runs"]), yes_no(i.get("node_local"))
                    )
                return t

            show(url, "/v1/hints/classes", params, as_json=as_json, render=render)
            return
        try:
            items = api_get(url, "/v1/hints/classes", params).json()["items"]
            write_atomically(out, classes_tsv(items))
        except (ApiError, OSError) as exc:
            _fail(f"pharos slurm classes: {exc}")
        typer.echo(f"{len(items)} I/O classes written to {out}")

    @slurm.command("status")
    def status(
        statedir: Annotated[
            Path, typer.Option(envvar="PHAROS_SLURM_STATEDIR", help="The plugin's statedir= option.")
        ] = STATE_DIR,
        as_json: Annotated[bool, typer.Option("--json", help="Print the counters as JSON.")] = False,
    ) -> None:
        """The SPANK plugin's counters on this node (a skipped hint: the job ran on the default mapping)."""
        try:
            counts: dict[str, int | None] = {**read_counters(statedir), "spool_pending": spool_pending(statedir)}
        except OSError as exc:
            _fail(f"pharos slurm status: {exc}")
        if as_json:
            import json

            typer.echo(json.dumps(counts))
            return
        t = Table("counter", "value", title=f"Pharos SPANK plugin ({statedir})")
        bad = ("failed", "skipped", "unplaced", "dropped", "pending")
        for k, v in counts.items():
            t.add_row(
                k, "unreadable (root only)" if v is None else str(v), style="bold red" if k.endswith(bad) and v else ""
            )
        Console().print(t)

    @slurm.command("config")
    def config(api: ApiOption = None, statedir: Annotated[Path, typer.Option()] = STATE_DIR) -> None:
        """Print the plugstack.conf and slurm.conf lines that install Pharos on a Slurm cluster."""
        from pharos_core.settings import get_settings

        s = get_settings()
        typer.echo(f"# plugstack.conf (every compute node; the plugin is built by `make build`: {PLUGIN})")
        typer.echo(
            f"optional {PLUGIN} api={(api or s.api_url).rstrip('/')} cgroup_parent={s.cgroup_parent} statedir={statedir} timeout=2"
        )
        typer.echo("# on the API's own host, instead of a token: socket=<the API's state_dir>/api.sock (root is admin)")
        typer.echo("# slurm.conf")
        typer.echo("PlugStackConfig=/etc/slurm/plugstack.conf")
        typer.echo(f"JobSubmitPlugins=lua   # copy {JOB_SUBMIT_LUA} next to slurm.conf")
        typer.echo(f"# cron or a timer on the controller: pharos slurm classes --out {statedir / 'classes.tsv'}")
