"""Pharos configuration: one settings object, from a TOML file and the environment.

Precedence (highest first): environment variables ``PHAROS_<FIELD>`` (e.g.
``PHAROS_KAFKA_BOOTSTRAP``), the TOML file named by ``PHAROS_CONFIG`` (default
``pharos.toml`` in the working directory, if present), then the defaults below, which run
the embedded stack on loopback.

:class:`PharosSettings` is the one place where these sources are set up; every Pharos
configuration class derives from it (:class:`Settings` at the file's top level,
``DiagnosisConfig`` in its ``[diagnosis]`` table, ``ControlConfig`` in ``[control]``).
"""

from __future__ import annotations

import ipaddress
import os
import secrets
import tomllib
from functools import lru_cache
from pathlib import Path
from typing import ClassVar, Literal

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

REPO_ROOT = Path(__file__).resolve().parents[2]


def config_file() -> Path:
    """The Pharos settings file: the path in ``PHAROS_CONFIG``, else ``pharos.toml`` in the
    working directory (read only if it exists)."""
    return Path(os.environ.get("PHAROS_CONFIG", "pharos.toml"))


class PharosSettings(BaseSettings):
    """Base of every Pharos configuration class: one set-up of the sources.

    Precedence (highest first): explicit constructor arguments, environment variables
    (``model_config["env_prefix"]`` + field name), the settings file (:func:`config_file`) at
    its top level or, when ``toml_table`` is set, in that table (``[diagnosis]``,
    ``[control]``), then the field defaults. Dotenv and secret files are not read."""

    toml_table: ClassVar[str | None] = None

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        header = (cls.toml_table,) if cls.toml_table else None
        path = config_file()
        if header and path.is_file():
            # a file without this class's table (e.g. only [control]) gives it nothing, not an error
            with path.open("rb") as f:
                if cls.toml_table not in tomllib.load(f):
                    return init_settings, env_settings
        return (
            init_settings,
            env_settings,
            TomlConfigSettingsSource(settings_cls, toml_file=path, toml_table_header=header),
        )


class Settings(PharosSettings):
    """Every Pharos process reads this. Paths are absolute after validation."""

    model_config = SettingsConfigDict(env_prefix="PHAROS_", extra="ignore")

    state_dir: Path = Field(
        default=REPO_ROOT / ".pharos",
        description="Where the embedded stack keeps its data: Kafka log, chDB data, pid files, logs.",
    )
    kafka_bootstrap: str = Field(
        default="127.0.0.1:19092",
        description="Kafka bootstrap servers, host:port[,host:port...]. With kafka_brokers = N > 1 and one "
        "address given, it stands for the embedded cluster's N nodes: port, port + 2, ... (expanded on load).",
    )
    kafka_brokers: int = Field(
        default=1,
        ge=1,
        le=9,
        description="Kafka nodes the embedded launcher starts (`pharos broker`, `pharos up`): combined KRaft "
        "broker + controller nodes on loopback, node i on the i-th kafka_bootstrap address (controller on its "
        "port + 1). From 3 on, the topics get replication factor 3 and min.insync.replicas 2. A site's own "
        "cluster: leave 1, list its brokers in kafka_bootstrap and set topic_replication_factor.",
    )
    kafka_home: Path = Field(
        default=REPO_ROOT / "build" / "kafka",
        description="Folder holding the Kafka jars (libs/) fetched by `make kafka`.",
    )
    topic_requests: str = "pharos.io.requests"
    topic_jobs: str = "pharos.jobs"
    topic_deadletter: str = "pharos.io.deadletter"
    topic_target_metrics: str = "pharos.target.metrics"
    topic_partitions: int = Field(default=4, ge=1, description="Partitions of the requests topic.")
    topic_replication_factor: int = Field(
        default=1,
        ge=1,
        description="Replication factor of the topics Pharos creates (`pharos topics`, `pharos broker`): 1 on "
        "one broker; 3 on a cluster of 3 or more brokers (then Pharos sets the topics' min.insync.replicas to "
        "2). At least min(3, kafka_brokers). Topics that exist keep theirs.",
    )
    consumer_group: str = "pharos-pipeline"
    consumer_instance_id: str = Field(
        default="",
        description="Kafka static group membership id of the pipeline consumer (group.instance.id): a "
        "restarted pipeline takes its partitions back at once instead of waiting for the dead member's "
        "session to time out. Empty: dynamic membership. Must be unique per running pipeline.",
    )
    pipeline_max_messages: int = Field(
        default=50_000,
        ge=1,
        description="Pipeline: most Kafka messages per poll (one store insert per poll). Polls are bounded by "
        "pipeline_max_poll_mb too: small messages (an agent's 200 ms batch of a few records) make big polls, "
        "so the store's per-poll cost (the exactly-once checks, one insert) is paid per ~MiBs, not per message.",
    )
    pipeline_max_poll_mb: float = Field(
        default=64.0,
        gt=0,
        description="Pipeline: most message bytes per poll, MiB (a poll stops taking messages once it holds this "
        "much; one message more at most). Bigger polls make bigger blocks: fewer parts to merge and rollup rows "
        "per record (on the simulated 4,096-node mix, 64 MiB ~ 240,000 records: 3.2 CPU us a record, 32 MiB 4.4).",
    )
    pipeline_max_wait_ms: int = Field(
        default=200, ge=1, description="Pipeline: longest wait for a poll to fill, in ms (whichever comes first)."
    )
    pipeline_prefetch: bool = Field(
        default=True,
        description="Pipeline: when a poll comes back full or with messages still queued (a backlog), take the next "
        "poll from Kafka and decode its headers in a background thread while this one is stored, filling it until "
        "it is full or this one is committed (the store's inserts and commits stay in order in one thread). "
        "False: one poll at a time.",
    )
    pipeline_parse_threads: int = Field(
        default=2,
        ge=1,
        le=64,
        description="Pipeline: threads the store uses to decode a poll's IoBatch messages (chDB; a server "
        "decodes the request body with one).",
    )
    clickhouse_url: str = Field(
        default="",
        description="ClickHouse server URL (http://user:pass@host:8123/db). Empty: embedded chDB in state_dir/chdb.",
    )
    api_host: str = Field(
        default="127.0.0.1",
        description="Address the API's TCP port binds. Anything but loopback (127.0.0.0/8, ::1, localhost) "
        "needs api_auth = 'token': `pharos serve` refuses to start otherwise.",
    )
    api_port: int = Field(default=8400, ge=1, le=65535)
    api_auth: Literal["none", "token"] = Field(
        default="token",
        description="Server, the TCP port: 'token' = every endpoint but /v1/health needs `Authorization: Bearer "
        "<token>` (tokens made by `pharos token create`, roles admin | operator | user | scheduler; "
        "docs/security.md); 'none' = open, every request acts as admin (a development setting, on loopback "
        "only, logged loudly). The Unix socket (api_socket) always authenticates by peer credentials.",
    )
    api_socket: str | None = Field(
        default=None,
        description="Server and local clients: the API's Unix socket (mode 0666), where the caller's uid from "
        "the kernel (SO_PEERCRED) is its identity: root and the server's own uid act as admin, any other uid "
        "as role 'user' named by its login, seeing its own jobs. None: <state_dir>/api.sock; '' = no socket. "
        "The CLI uses it when it exists and no --api URL, PHAROS_API_URL or token is given.",
    )
    api_token: SecretStr = Field(
        default=SecretStr(""),
        description="Client (CLI, `pharos run`): the API token sent as a Bearer token (PHAROS_API_TOKEN; "
        "`pharos --token`). Empty: read api_token_file, if set.",
    )
    api_token_file: Path | None = Field(
        default=None,
        description="Client: a file holding the API token (first line), used when api_token is empty.",
    )
    import_dir: Path | None = Field(
        default=None,
        description="Server: the only folder `POST /v1/import/darshan` reads logs from (paths relative to it, "
        "no symbolic link followed). None: path imports are refused; upload the log instead "
        "(POST /v1/import/darshan/upload).",
    )
    import_max_bytes: int = Field(
        default=256 * 2**20,
        ge=1,
        le=2**40,
        description="Largest Darshan log (bytes) an import reads, by path or upload (413 / failed beyond).",
    )
    import_timeout_s: float = Field(
        default=120.0,
        gt=0,
        le=86400,
        description="Longest time (s) one import may spend reading a log's bytes (hash or upload).",
    )
    import_parse_cpu_s: float = Field(
        default=120.0,
        gt=0,
        le=86400,
        description="CPU seconds parsing one Darshan log may use (PyDarshan runs in a child process; a "
        "failed import beyond). Wall time: twice this plus 10 s.",
    )
    import_parse_memory_bytes: int = Field(
        default=4 * 2**30,
        ge=2**20,
        le=2**42,
        description="Bytes of memory (RLIMIT_DATA) parsing one Darshan log may allocate (a failed import beyond).",
    )
    api_timeout_s: float = Field(
        default=30.0,
        gt=0,
        le=3600,
        description="Longest time (s) a CLI command waits for one answer of the Pharos API (a job list or a "
        "diagnosis of a job with millions of requests takes seconds on a busy store).",
    )
    agent_binary: Path = Field(
        default=REPO_ROOT / "target" / "release" / "pharos-agent",
        description="The eBPF agent binary built by `make build`.",
    )
    agent_metrics_addr: str = Field(
        default="127.0.0.1:9435", description="Loopback address of the agent's Prometheus metrics ('' = off)."
    )
    heartbeat_interval_s: float = Field(
        default=2.0,
        gt=0,
        le=3600,
        description="Producers (eBPF agents, forwarding daemons) send an empty IoBatch when they sent nothing "
        "for this long (s): their io_batches rows are their liveness timeline. Give agents and the server the "
        "same value (`pharos agent` passes it as --heartbeat-ms; pharos-fwd beats every 2 s).",
    )
    heartbeat_missed: int = Field(
        default=3,
        ge=2,
        le=100,
        description="A producer silent for more than this many heartbeat intervals is dead or stale: a job that "
        "ran on its host meanwhile is incomplete (its summary's gaps), `pharos status` shows it.",
    )
    fwd_binary: Path = Field(
        default=REPO_ROOT / "target" / "release" / "pharos-fwd",
        description="The forwarding daemon built by `make build`.",
    )
    mount_binary: Path = Field(
        default=REPO_ROOT / "target" / "release" / "pharos-mount", description="The FUSE client built by `make build`."
    )
    fwd_nodes: int = Field(
        default=4,
        ge=0,
        description="Forwarding daemons `pharos up` starts, fwd0..fwd<N-1> (0: no forwarding layer). Those named "
        "in `[control] reserved_nodes` (default fwd2, fwd3) are kept out of the mount's default mapping and handed "
        "out by the control loop as dedicated nodes (DFRA); the others serve the default mapping.",
    )
    fwd_port_base: int = Field(
        default=7400,
        ge=0,
        description="Forwarding node i listens on base+10i and serves admin HTTP on base+10i+1 (loopback); 0: free ports.",
    )
    fwd_targets: int = Field(default=8, ge=1, description="Storage targets (OSTs) behind the forwarding daemons.")
    fwd_target_limits_mb_s: list[float] = Field(
        default_factory=list,
        description="Token-bucket limit of each target in MB/s (ost0, ost1, ...; 0 or missing: unlimited).",
    )
    mount_admin_port: int = Field(
        default=7501, ge=0, description="Admin HTTP port of the FUSE client (0: a free port)."
    )
    fwd_key_file: Path | None = Field(
        default=None,
        description="The forwarding layer's site key: a root-only file (mode 0600, >= 32 bytes, e.g. "
        "`openssl rand -hex 32`) that every pharos-fwd and pharos-mount of the site holds; mounts and daemons "
        "prove it to each other and the daemons sign capabilities with it (docs/security.md). None: "
        "<state_dir>/fwd.key, made by `pharos fwd` / `pharos mount` (`pharos up`) when missing.",
    )
    fwd_admin_token_file: Path | None = Field(
        default=None,
        description="The admin token of the daemons' and the mount's admin HTTP interfaces (every route but "
        "GET /status needs it): a root-only file the control loop reads too. None: <state_dir>/fwd-admin.token, "
        "made by `pharos fwd` / `pharos mount` (`pharos up`) when missing.",
    )
    fwd_listen_host: str = Field(
        default="127.0.0.1",
        description="Address `pharos fwd` binds (data and admin ports). On a cluster: the forwarding node's "
        'address on the network its compute nodes reach (docs/operations.md, "A cluster").',
    )
    fwd_addresses: dict[str, str] = Field(
        default_factory=dict,
        description="Forwarding node name -> HOST:PORT of its daemon, for `pharos mount` on a compute node "
        '(e.g. {"fwd0": "10.0.0.21:7400"}; names fwd0..fwd<N-1> of fwd_nodes). Empty: the ready files of the '
        "daemons `pharos up` started on this host.",
    )
    mount_dir: Path | None = Field(
        default=None,
        description="Where `pharos mount` mounts the forwarding layer. None: <state_dir>/mnt. On a cluster: the "
        "same path on every compute node (e.g. /pharos), so a job's file has one name on all its nodes.",
    )
    mount_admin_host: str = Field(
        default="127.0.0.1",
        description="Address of the FUSE client's admin HTTP interface (port mount_admin_port). On a cluster: "
        "the compute node's address the server's control loop reaches ([control] mount_admin_urls).",
    )
    compute_node_name: str = Field(
        default="",
        description="This compute node's name in every record of its eBPF agent and FUSE client. Empty: the "
        "host name (a cluster's nodes have their own).",
    )
    compute_node_index: int = Field(
        default=0,
        ge=0,
        description="This compute node's index: its default forwarding node is index mod the number of "
        "non-reserved forwarding nodes (fwd0, fwd1 by default), or (index // compute_nodes_per_forwarding_node) "
        "mod that number when compute_nodes_per_forwarding_node is set.",
    )
    compute_nodes_per_forwarding_node: int = Field(
        default=0,
        ge=0,
        description="DFRA (Ji et al., FAST'19 §2): the static default mapping gives each forwarding node a block "
        "of this many consecutive compute nodes (Sunway TaihuLight: 512), so a job on neighbouring nodes shares "
        "one forwarding node until DFRA gives it more. 0: compute nodes take the shared forwarding nodes in turn "
        "(index mod their number).",
    )
    cgroup_parent: str = Field(
        default="pharos",
        description="cgroup v2 folder (relative to the cgroup2 mount) under which `pharos run` creates job_<id>.",
    )
    run_hint: bool = Field(
        default=True,
        description="`pharos run` asks the API for the job's DFRA forwarding-node decision (POST "
        "/v1/hints/jobs/{id}?apply=true) before starting the ranks; false (or --no-hint): the mount's default.",
    )
    run_hint_timeout_s: float = Field(
        default=15.0,
        gt=0,
        description="`pharos run`: longest wait (s) for the hint; past it the job runs with the default mapping.",
    )

    @model_validator(mode="after")
    def _cluster_bootstrap(self) -> Settings:
        """One bootstrap address with kafka_brokers = N > 1: the embedded cluster's N nodes
        (port + 2i, see pharos_pipeline.broker.node_addresses), so every client lists them all
        and still connects with any one node down."""
        servers = [a.strip() for a in self.kafka_bootstrap.split(",") if a.strip()]
        host, _, port = servers[0].rpartition(":") if len(servers) == 1 else ("", "", "")
        if self.kafka_brokers > 1 and host and port.isdigit():
            self.kafka_bootstrap = ",".join(f"{host}:{int(port) + 2 * i}" for i in range(self.kafka_brokers))
        return self

    @property
    def chdb_path(self) -> Path:
        return self.state_dir / "chdb"

    @property
    def mount_point(self) -> Path:
        """Where `pharos up` mounts the forwarding layer (the FUSE client): ``mount_dir``, else
        <state_dir>/mnt."""
        return self.mount_dir or self.state_dir / "mnt"

    @property
    def fwd_backend(self) -> Path:
        """The storage targets (ost0..) and namespace (mdt) the forwarding daemons share."""
        return self.state_dir / "fwd"

    @property
    def silence_s(self) -> float:
        """Longest silence (s) of a live producer: ``heartbeat_missed`` x ``heartbeat_interval_s``."""
        return self.heartbeat_missed * self.heartbeat_interval_s

    @property
    def fwd_key_path(self) -> Path:
        """The site key file: ``fwd_key_file``, else <state_dir>/fwd.key (the embedded stack's)."""
        return (self.fwd_key_file or self.state_dir / "fwd.key").expanduser()

    @property
    def fwd_admin_token_path(self) -> Path:
        """The admin token file: ``fwd_admin_token_file``, else <state_dir>/fwd-admin.token."""
        return (self.fwd_admin_token_file or self.state_dir / "fwd-admin.token").expanduser()

    def ensure_fwd_secrets(self) -> None:
        """Makes the embedded stack's site key and admin token (32 random bytes as hex, mode 0600
        from creation) when they are the defaults in state_dir and missing. A configured file is
        never made: every node of a site must hold the same one (the daemons refuse a missing file)."""
        for configured, path in (
            (self.fwd_key_file, self.fwd_key_path),
            (self.fwd_admin_token_file, self.fwd_admin_token_path),
        ):
            if configured is not None:
                continue
            path.parent.mkdir(parents=True, exist_ok=True)
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError:
                continue
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_hex(32) + "\n")

    def fwd_admin_headers(self) -> dict[str, str]:
        """The ``Authorization`` header of the admin interfaces (empty when the token file is
        missing or unreadable: the interfaces then answer 401)."""
        return admin_headers(self.fwd_admin_token_path)

    @property
    def api_url(self) -> str:
        """The API's TCP base URL, ``http://<api_host>:<api_port>``."""
        return f"http://{self.api_host}:{self.api_port}"

    @property
    def api_socket_path(self) -> Path | None:
        """The API's Unix socket: ``api_socket``, else <state_dir>/api.sock; None when
        ``api_socket`` is '' (no socket)."""
        if self.api_socket is None:
            return self.state_dir / "api.sock"
        return Path(self.api_socket).expanduser().absolute() if self.api_socket.strip() else None

    def api_token_value(self) -> str:
        """The client's API token: ``api_token``, else the first line of ``api_token_file``,
        else ''. Raises OSError when the token file cannot be read."""
        token = self.api_token.get_secret_value().strip()
        if token or self.api_token_file is None:
            return token
        return self.api_token_file.expanduser().read_text().strip().split("\n", 1)[0].strip()

    def exposure_error(self) -> str | None:
        """Why this API configuration must not start (a non-loopback ``api_host`` with
        ``api_auth = 'none'``), or None when it may."""
        if self.api_auth == "none" and not is_loopback(self.api_host):
            return (
                f"api_host {self.api_host!r} is not a loopback address and api_auth is 'none': anyone who "
                'reaches it could read every job and change the control loop. Set api_auth = "token" in '
                "pharos.toml (or PHAROS_API_AUTH=token) and create tokens with `pharos token create` "
                "(docs/security.md), or bind 127.0.0.1"
            )
        return None


def admin_headers(token_file: Path) -> dict[str, str]:
    """``{"Authorization": "Bearer <token>"}`` from a token file (its first line), or ``{}``
    when it cannot be read."""
    try:
        token = token_file.expanduser().read_text().strip().split("\n", 1)[0].strip()
    except OSError:
        return {}
    return {"Authorization": f"Bearer {token}"} if token else {}


def is_loopback(host: str) -> bool:
    """True for 'localhost' and addresses in 127.0.0.0/8 or ::1 (brackets allowed)."""
    h = host.strip().strip("[]").lower()
    if h in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(h).is_loopback
    except ValueError:
        return False


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings (read once)."""
    return Settings()
