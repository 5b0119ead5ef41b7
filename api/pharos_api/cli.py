"""The ``pharos`` command line.

Stack:   pharos up [--detach] · pharos down · pharos status
Jobs:    pharos run --job ID [--ranks N] -- CMD... · pharos jobs · pharos job ID [--json]
Control: pharos hint JOB · pharos control actions|pins|pin|unpin
Access:  pharos token create --role ROLE [--user NAME] · pharos token list · pharos token revoke ID
Demo:    pharos demo
Parts:   pharos broker · pharos agent · pharos serve (what `pharos up` starts)
Deploy:  pharos topics (create the Kafka topics on an existing broker; docs/operations.md)

Configuration: pharos.toml (or the file in PHAROS_CONFIG) and PHAROS_* environment
variables; see `pharos config`. On the API host the commands that ask the API use its Unix
socket (api_socket: your login is your identity, root's is admin); elsewhere, or with a URL
(--api, PHAROS_API_URL) or a token given, its TCP port with a token: `pharos --token TOKEN
...`, PHAROS_API_TOKEN, or api_token_file (docs/security.md).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from pharos_core.settings import get_settings

from .cli_control import register as register_control_commands
from .cli_diagnose import register as register_diagnose_commands
from .cli_jobs import register as register_jobs_commands
from .cli_slurm import register as register_slurm_commands
from .cli_system import register as register_system_commands
from .cli_tokens import register as register_token_commands

app = typer.Typer(
    help="Pharos: end-to-end I/O monitoring and diagnosis for HPC storage.",
    no_args_is_help=True,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
console = Console()
err = Console(stderr=True)


def wait_for_stop_signal(every_s: float | None = None, tick=None) -> None:
    """Block until SIGINT or SIGTERM arrives (so `finally` clean-up always runs); with
    ``every_s``, call ``tick()`` every that many seconds meanwhile."""
    sigs = {signal.SIGINT, signal.SIGTERM}
    signal.pthread_sigmask(signal.SIG_BLOCK, sigs)
    if every_s is None:
        signal.sigwait(sigs)
        return
    while signal.sigtimedwait(sigs, every_s) is None:
        tick()


def fail(message: str, code: int = 1) -> None:
    """Print one clear error line and exit."""
    err.print(f"[bold red]pharos:[/] {message}", highlight=False)
    raise typer.Exit(code)


@app.callback()
def main_options(
    token: Annotated[
        str | None,
        typer.Option(
            "--token",
            help="API token for the commands that ask the API (default: PHAROS_API_TOKEN, then the api_token_file "
            "setting). Made by `pharos token create`.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Pharos: end-to-end I/O monitoring and diagnosis for HPC storage."""
    from pydantic import SecretStr

    from . import cli_jobs

    cli_jobs.TOKEN_OVERRIDE = token
    if token:  # also for what reads the settings (pharos run's hint request)
        get_settings().api_token = SecretStr(token)


def check_exposure(settings) -> None:
    """Exit with one line when the settings would serve the API beyond loopback without auth."""
    problem = settings.exposure_error()
    if problem:
        fail(problem, 2)


#: How often the foreground `pharos up` checks for dead components, in seconds.
SUPERVISE_S = 5.0


@app.command()
def up(
    detach: Annotated[
        bool, typer.Option("--detach", "-d", help="Return once the stack is ready; stop it with `pharos down`.")
    ] = False,
) -> None:
    """Start the embedded stack: Kafka broker, eBPF agent, pipeline + analytics + API (chDB).

    Components already running are kept and dead ones (crashed, killed) started again, so
    running it again restarts what died. In the foreground it also watches them: a component
    that dies is started again within 5 s (its log says why it died; one that does not come
    back is retried with growing delays, at most 60 s).
    """
    from .stack import StackError, Supervisor, start, stop

    settings = get_settings()
    check_exposure(settings)
    try:
        start(settings, progress=lambda s: console.print(f"  {s}"))
    except StackError as exc:
        fail(str(exc))
    sock = settings.api_socket_path
    console.print(
        f"[green]Pharos is up.[/] API: {settings.api_url}  (OpenAPI: {settings.api_url}/docs)"
        + (f"; local commands use its socket {sock}" if sock else "")
    )
    if settings.api_auth == "none":
        console.print(f"[bold yellow]api_auth = 'none': {settings.api_url} is open, every local user is admin[/]")
    if detach:
        return
    console.print("Press Ctrl-C to stop.")

    supervisor = Supervisor(settings, progress=lambda s: console.print(f"  {s}", highlight=False))

    def supervise() -> None:
        for name in supervisor.tick():
            console.print(f"[green]{name} had died: started again[/]")

    wait_for_stop_signal(SUPERVISE_S, supervise)
    stop(settings, progress=lambda s: console.print(f"  {s}"))


@app.command()
def down() -> None:
    """Stop the embedded stack started by `pharos up`."""
    from .stack import stop

    stop(get_settings(), progress=lambda s: console.print(f"  {s}"))
    console.print("Pharos is down.")


_STATE_STYLE = {"running": "green", "starting": "yellow", "stale": "bold yellow", "dead": "bold red", "stopped": "dim"}


@app.command()
def status(json_out: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False) -> None:
    """Show the stack's components (running, starting, stale, dead or stopped), the producers'
    heartbeats and the pipeline's counters. Exit code 1 unless every component runs.

    dead: its process is gone (crashed, killed) or its pid was reused: `pharos up` starts it
    again. stale: alive, but not ready, or (agent, forwarding daemons) no heartbeat stored for
    more than heartbeat_missed x heartbeat_interval_s seconds."""
    from .cli_jobs import ApiError, _api_url, api_get
    from .stack import status as stack_status

    settings = get_settings()
    pipeline = producers = None
    url = _api_url(None)
    with contextlib.suppress(ApiError, ValueError):
        pipeline = api_get(url, "/v1/pipeline", timeout=3).json()
    with contextlib.suppress(ApiError, ValueError):
        producers = api_get(url, "/v1/producers", timeout=3).json()["items"]
    rows = stack_status(settings, producers)
    if json_out:
        print(json.dumps({"components": rows, "pipeline": pipeline, "producers": producers}, indent=2))
    else:
        t = Table("component", "state", "pid", "heartbeat", "detail", "log")
        for r in rows:
            beat = "-" if r["heartbeat_age_s"] is None else f"{r['heartbeat_age_s']:.1f} s ago"
            st = r["state"]
            t.add_row(r["name"], f"[{_STATE_STYLE[st]}]{st}[/]", str(r["pid"] or "-"), beat, r["detail"], r["log"])
        console.print(t)
        if producers is None:
            console.print("[yellow]heartbeats not checked: the API does not answer[/]")
        if pipeline:
            console.print("pipeline: " + ", ".join(f"{k}={v}" for k, v in pipeline.items()))
    if not all(r["state"] == "running" for r in rows):
        raise typer.Exit(1)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def run(
    ctx: typer.Context,
    job: Annotated[str, typer.Option("--job", "-j", help="Job id (letters, digits, _ . -).")],
    ranks: Annotated[int, typer.Option("--ranks", "-n", min=1, help="Number of ranks to start.")] = 1,
    name: Annotated[str | None, typer.Option(help="Job name (default: the command's name).")] = None,
    output_dir: Annotated[
        Path | None, typer.Option("--output-dir", help="Write rank r's stdout to DIR/rank_<r>.out.")
    ] = None,
    hint: Annotated[
        bool | None,
        typer.Option(
            "--hint/--no-hint",
            help="Ask the API for the job's forwarding nodes (DFRA) and apply them before the first I/O "
            "(default: setting run_hint, PHAROS_RUN_HINT, true).",
        ),
    ] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Do not print the forwarding decision.")] = False,
    node_local: Annotated[
        Path | None,
        typer.Option(
            "--node-local",
            help="A pharos-mount's mount point: rank r gets the node-local directory "
            "MOUNT/.nodelocal/<job>/<r> (on the storage target its rank id hashes to, no shared "
            "metadata operation), named by PHAROS_NODELOCAL.",
        ),
    ] = None,
) -> None:
    """Run N ranks of CMD as a traced job: pharos run --job ID [--ranks N] -- CMD...

    Each rank runs in the job's cgroup with PHAROS_JOB_ID, PHAROS_RANK and PHAROS_NRANKS
    set; start and end go to the jobs topic. Before the ranks start, the job's DFRA decision
    (forwarding nodes from its earlier runs) is asked from the API and pushed to the mount; one
    line on stderr says it (or warns that the API did not answer: the default mapping then).
    Exits with the first non-zero rank exit code.
    """
    from pharos_agents.runner import RunError, run_job

    command = list(ctx.args)
    if command and command[0] == "--":
        command = command[1:]
    try:
        result = run_job(
            get_settings(),
            job,
            command,
            ranks=ranks,
            name=name,
            output_dir=output_dir,
            hint=hint,
            quiet=quiet,
            node_local=node_local,
        )
    except (RunError, ValueError) as exc:
        fail(str(exc), 2)
    raise typer.Exit(result.exit_code)


@app.command()
def broker(
    node_id: Annotated[
        int | None,
        typer.Option(
            "--node-id",
            min=1,
            help="Run only Kafka node ID (1..kafka_brokers) of the cluster whose nodes kafka_bootstrap lists, one "
            "address per node: each node on its own host (a cluster, or the rig's namespaces), the cluster id "
            "shared through <state_dir>/kafka/cluster.id.",
        ),
    ] = None,
) -> None:
    """Run the local Kafka broker (KRaft, loopback; kafka_brokers > 1: a cluster of that many nodes) in the
    foreground, or with --node-id one node of a cluster whose other nodes run elsewhere."""
    from pharos_pipeline.broker import BrokerError, KafkaCluster, embedded_kafka, ensure_topics

    settings = get_settings()
    try:
        if node_id is None:
            b = embedded_kafka(settings, settings.state_dir / "kafka")
        else:
            if node_id > settings.kafka_brokers:
                fail(f"--node-id {node_id}: the cluster has kafka_brokers = {settings.kafka_brokers} nodes", 2)
            cluster = KafkaCluster(settings, settings.state_dir / "kafka")
            b = cluster.nodes[cluster.index_of(node_id)]
    except BrokerError as exc:
        fail(str(exc))
    try:
        b.start(timeout=60 + 60 * settings.kafka_brokers)
        if node_id is not None:
            cluster.wait_brokers(120)  # the topics' replicas need every node
        ensure_topics(settings)
        where = settings.kafka_bootstrap if node_id is None else f"{b.bootstrap} (node {node_id})"
        console.print(f"Kafka ({settings.kafka_brokers} node(s)) ready on {where}")
        wait_for_stop_signal()
    except BrokerError as exc:
        fail(str(exc))
    finally:
        b.stop()


@app.command()
def schema(
    cluster: Annotated[
        str,
        typer.Option(help="Name of the ClickHouse cluster (remote_servers) to print the cluster variant for."),
    ],
) -> None:
    """Print the ClickHouse schema for a cluster: every table of the migrations as a replicated
    `T_local` on each node plus a Distributed `T` over them (sharded by job for the traced
    requests), to run once with clickhouse-client before pointing Pharos at the cluster
    (docs/operations.md, "Scale out")."""
    from pharos_core.cluster_schema import cluster_schema

    try:
        migrations = cluster_schema(cluster)
    except ValueError as exc:
        fail(str(exc))
    for name, statements in migrations:
        typer.echo(f"-- {name}")
        for stmt in statements:
            typer.echo(stmt + ";\n")


@app.command()
def topics() -> None:
    """Create the Pharos topics on kafka_bootstrap where missing (partitions and replication factor from the
    settings; existing topics are left as they are) and print each topic's partitions."""
    from confluent_kafka import KafkaException

    from pharos_pipeline.broker import ensure_topics

    settings = get_settings()
    try:
        made = ensure_topics(settings)
    except KafkaException as exc:
        why = exc.args[0].str() if exc.args and hasattr(exc.args[0], "str") else str(exc)
        fail(
            f"creating the topics on {settings.kafka_bootstrap} (replication factor "
            f"{settings.topic_replication_factor}) failed: {why}"
        )
    for topic, partitions in made.items():
        console.print(f"{topic}\t{partitions} partitions", highlight=False)


@app.command()
def agent(
    extra: Annotated[list[str] | None, typer.Argument(help="Extra flags passed to pharos-agent.")] = None,
) -> None:
    """Run the eBPF agent (needs root) in the foreground, configured from Pharos settings."""
    settings = get_settings()
    binary = settings.agent_binary
    if not binary.exists():
        fail(f"agent binary {binary} not built: run `make build`", 2)
    from .stack import ready_file

    ready_file(settings, "agent").parent.mkdir(parents=True, exist_ok=True)
    argv = [
        str(binary),
        "--brokers",
        settings.kafka_bootstrap,
        "--topic",
        settings.topic_requests,
        "--cgroup-parent",
        settings.cgroup_parent,
        "--ready-file",
        str(ready_file(settings, "agent")),
        "--metrics-addr",
        settings.agent_metrics_addr,
        "--block-jobs-only",
        "--heartbeat-ms",
        str(round(settings.heartbeat_interval_s * 1000)),
        *(["--host", settings.compute_node_name] if settings.compute_node_name else []),
        *(extra or []),
    ]
    os.execv(argv[0], argv)


def fwd_auth_args(s) -> list[str]:
    """``--key-file`` and ``--admin-token-file`` of pharos-fwd and pharos-mount (the site key and
    the admin token: ``fwd_key_file``, ``fwd_admin_token_file``, by default in state_dir)."""
    return ["--key-file", str(s.fwd_key_path), "--admin-token-file", str(s.fwd_admin_token_path)]


@app.command()
def fwd(
    index: Annotated[int, typer.Option("--index", "-i", min=0, help="Forwarding node number: fwd<INDEX>.")] = 0,
    extra: Annotated[list[str] | None, typer.Argument(help="Extra flags passed to pharos-fwd.")] = None,
) -> None:
    """Run forwarding daemon fwd<INDEX> (LWFS-style) on the shared storage targets."""
    from .stack import ready_file

    s = get_settings()
    if not s.fwd_binary.exists():
        fail(f"forwarding daemon {s.fwd_binary} not built: run `make build`", 2)
    port = lambda k: 0 if s.fwd_port_base == 0 else s.fwd_port_base + 10 * index + k  # noqa: E731
    (s.fwd_backend / "mdt").mkdir(parents=True, exist_ok=True)
    ready_file(s, f"fwd{index}").parent.mkdir(parents=True, exist_ok=True)
    s.ensure_fwd_secrets()
    argv = [
        str(s.fwd_binary),
        "--node-name",
        f"fwd{index}",
        "--listen",
        f"{s.fwd_listen_host}:{port(0)}",
        "--admin",
        f"{s.fwd_listen_host}:{port(1)}",
        "--mdt",
        str(s.fwd_backend / "mdt"),
        "--targets-root",
        str(s.fwd_backend),
        "--target-count",
        str(s.fwd_targets),
        "--brokers",
        s.kafka_bootstrap,
        "--topic",
        s.topic_requests,
        "--metrics-topic",
        s.topic_target_metrics,
        "--ready-file",
        str(ready_file(s, f"fwd{index}")),
        *fwd_auth_args(s),
    ]
    for t, limit in enumerate(s.fwd_target_limits_mb_s[: s.fwd_targets]):
        if limit > 0:
            argv += ["--limit", f"ost{t}={limit:g}"]
    os.execv(argv[0], argv + list(extra or []))


def mount_node_order(s) -> list[str]:
    """The forwarding nodes in the order `pharos mount` passes them (``--fwd``): the shared nodes
    (not in ``[control] reserved_nodes``) first, then the reserved ones, each in index order.
    pharos-mount's default node is ``--node-index`` mod the number of nodes, and its failover
    candidates follow in ring order, so with :func:`mount_node_index` the default is always a
    shared node and the reserved ones come last among the failover candidates."""
    from pharos_analytics.control.config import ControlConfig

    reserved = set(ControlConfig().reserved_nodes)
    names = [f"fwd{i}" for i in range(s.fwd_nodes)]
    return [n for n in names if n not in reserved] + [n for n in names if n in reserved]


def mount_reserved(s) -> list[str]:
    """The reserved nodes `pharos mount` tells pharos-mount about (``PHAROS_MOUNT_RESERVED``:
    never its default node, last failover candidates): those of ``[control] reserved_nodes``
    that exist, none when no shared node would be left."""
    order = mount_node_order(s)
    reserved = order[mount_shared_count(s) :]
    return reserved if len(reserved) < len(order) else []


def mount_shared_count(s) -> int:
    """How many of the ``fwd_nodes`` forwarding nodes are shared (not reserved)."""
    from pharos_analytics.control.config import ControlConfig

    reserved = set(ControlConfig().reserved_nodes)
    return sum(1 for i in range(s.fwd_nodes) if f"fwd{i}" not in reserved)


def mount_node_index(s) -> int:
    """``--node-index`` of `pharos mount`: ``compute_node_index`` mod the shared nodes (all nodes
    when every node is reserved), so the default node is a shared one; with
    ``compute_nodes_per_forwarding_node`` = b > 0, ``compute_node_index // b`` instead of the index
    (DFRA's static mapping: a block of b consecutive compute nodes per forwarding node)."""
    block = (
        s.compute_node_index // s.compute_nodes_per_forwarding_node
        if s.compute_nodes_per_forwarding_node
        else s.compute_node_index
    )
    return block % (mount_shared_count(s) or max(s.fwd_nodes, 1))


@app.command()
def mount(
    extra: Annotated[list[str] | None, typer.Argument(help="Extra flags passed to pharos-mount.")] = None,
) -> None:
    """Mount the forwarding layer (FUSE client) at <state_dir>/mnt, on the running fwd daemons."""
    import subprocess

    from .stack import ready_file

    s = get_settings()
    if not s.mount_binary.exists():
        fail(f"FUSE client {s.mount_binary} not built: run `make build`", 2)
    names = mount_node_order(s)
    nodes = []
    for name in names:
        if s.fwd_addresses:  # a cluster: the daemons run on other nodes
            if name not in s.fwd_addresses:
                fail(f"fwd_addresses has no address for forwarding node {name} (fwd_nodes = {s.fwd_nodes})", 2)
            nodes += ["--fwd", f"{name}={s.fwd_addresses[name]}"]
            continue
        f = ready_file(s, name)
        if not f.exists():
            fail(f"forwarding daemon {name} is not running (no {f}): start it with `pharos up`", 2)
        nodes += ["--fwd", f"{name}={json.loads(f.read_text())['listen']}"]
    s.ensure_fwd_secrets()
    mp = s.mount_point
    try:
        mp.mkdir(parents=True, exist_ok=True)
    except OSError:  # a stale FUSE mount left by a crash: "Transport endpoint is not connected"
        subprocess.run(["fusermount3", "-uz", str(mp)], check=False)
        mp.mkdir(parents=True, exist_ok=True)
    argv = [
        str(s.mount_binary),
        "--mountpoint",
        str(mp),
        *nodes,
        "--node-index",
        str(mount_node_index(s)),
        "--admin",
        f"{s.mount_admin_host}:{s.mount_admin_port}",
        "--ready-file",
        str(ready_file(s, "mount")),
        *fwd_auth_args(s),
    ]
    env = dict(os.environ)
    if s.compute_node_name:
        env["PHAROS_MOUNT_COMPUTE_NODE"] = s.compute_node_name
    reserved = mount_reserved(s)
    if reserved:  # through the environment: a pharos-mount without --reserved ignores it
        env["PHAROS_MOUNT_RESERVED"] = ",".join(reserved)
    os.execve(argv[0], argv + list(extra or []), env)


@app.command()
def serve() -> None:
    """Run the pipeline, analytics and API in one process (what `pharos up` starts)."""
    from .server import serve as serve_
    from .unix_socket import UnixSocketError

    settings = get_settings()
    check_exposure(settings)
    try:
        serve_(settings)
    except UnixSocketError as exc:
        fail(str(exc), 2)


@app.command()
def demo(
    keep_running: Annotated[bool, typer.Option(help="Leave the stack running afterwards.")] = True,
) -> None:
    """The main job: start the stack, trace three real fio jobs (N-N, N-1, 1-1), report them."""
    from .demo import run_demo
    from .stack import StackError

    try:
        code = run_demo(get_settings(), console, keep_running=keep_running)
    except StackError as exc:
        fail(str(exc))
    raise typer.Exit(code)


@app.command("config")
def show_config() -> None:
    """Print the effective configuration (file + environment + defaults), with the ``[retention]``
    days each class of table keeps its rows (:mod:`pharos_core.retention`)."""
    from pharos_core.retention import RetentionConfig

    s = get_settings()
    out = json.loads(s.model_dump_json()) | {"retention": RetentionConfig().model_dump()}
    print(json.dumps(out, indent=2))


register_jobs_commands(app)
register_diagnose_commands(app)
register_system_commands(app)
register_control_commands(app)
register_slurm_commands(app)
register_token_commands(app)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
