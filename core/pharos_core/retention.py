"""How long the store keeps rows: the ``[retention]`` settings, applied as the tables' TTLs.

The migrations create every table that expires with a TTL counted from its ``ingested`` column
(the insert time): ``io_requests`` 90 days (002), ``io_rollup_1s`` 8 days (009), the other rollups
and the diagnosis, control, target and Darshan tables 90 days. These settings replace those
intervals, one setting per class of table (:data:`RETENTION_TABLES`); the defaults are the
migrations' intervals, so a site that sets none keeps what it had.

Override any field in the Pharos settings file (``pharos.toml``, or the file named by
``PHAROS_CONFIG``) under a ``[retention]`` table, or with an environment variable
``PHAROS_RETENTION_<FIELD>`` (e.g. ``PHAROS_RETENTION_RAW_DAYS=7``). Precedence: explicit
arguments, environment, file, defaults (:class:`~pharos_core.settings.PharosSettings`).

Applied by :func:`apply_retention` whenever the store is migrated
(:func:`pharos_core.store.migrate`: `pharos serve`, the standalone pipeline, the CLI commands
that open the store): each table whose TTL in force (``system.tables.engine_full``) has another
interval gets ``ALTER TABLE t MODIFY TTL <its TTL column> + INTERVAL <days> DAY``, logged; a table
that already has it gets nothing. The setting is the truth: a TTL changed by hand is set back at
the next start. A table whose TTL is not one ``column + N days`` rule (changed by hand into
something else, or removed) is left as it is, with a warning. ClickHouse re-evaluates the parts
in the background (a mutation, ``materialize_ttl_after_modify``): rows past a shortened TTL go at
the following merges, not during the ALTER. The same SQL on chDB and on a ClickHouse server.

On a cluster (:mod:`pharos_core.cluster_schema`) the TTL is on the shard-local ``T_local`` tables;
``T`` is Distributed and has none. ``T_local`` gets the ALTER ``ON CLUSTER`` of the cluster its
Distributed ``T`` names (as the cluster schema's own ``ALTER TABLE`` statements), so every node
gets it. Not run on a real cluster here.

``io_batches`` (a row per message of records: the exactly-once marker) expires with the raw
records it marks (015). Tables without a TTL keep every row and are not covered: ``job_events``,
``producer_drops``, ``dead_letters``, ``darshan_logs``, ``control_pins``, ``control_allocations``,
``api_tokens``, ``schema_migrations``.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Any, Protocol

from pydantic import Field, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from .settings import PharosSettings

log = logging.getLogger(__name__)

#: The tables each setting applies to (their TTL counts from ``ingested``, the insert time).
RETENTION_TABLES: dict[str, tuple[str, ...]] = {
    "raw_days": ("io_requests", "io_batches"),
    "rollup_1s_days": ("io_rollup_1s",),
    "rollup_days": ("io_rollup_1m", "io_rollup_forwarder_1m", "io_rollup_forwarder_10m"),
    "system_days": ("target_metrics", "darshan_counters", "anomalies", "alert_log", "control_actions"),
}

#: Longest retention (days): ``ingested + INTERVAL`` must stay below 2106, where ClickHouse's
#: DateTime ends (a TTL past it wraps to 1970, and every row would expire at once).
MAX_DAYS = 3650


class RetentionConfig(PharosSettings):
    """Days each class of table keeps its rows after they were stored (:data:`RETENTION_TABLES`).
    Whole days, 1 to :data:`MAX_DAYS`."""

    model_config = SettingsConfigDict(env_prefix="PHAROS_RETENTION_", extra="ignore")
    toml_table = "retention"

    raw_days: int = Field(
        default=90,
        ge=1,
        le=MAX_DAYS,
        description="Days the raw per-request records (io_requests, Darshan DXT segments included) and their batches' "
        "exactly-once markers (io_batches) are kept "
        "after they were stored (migrations 002, 015). What `pharos job`, `diagnose` and the per-request views "
        "read, and the dominant storage cost: ~0.2 TB a day per 1,024 compute nodes (docs/operations.md, "
        '"Sizing by site"). At most rollup_days (a warning otherwise).',
    )
    rollup_1s_days: int = Field(
        default=8,
        ge=1,
        le=MAX_DAYS,
        description="Days the per-second rollup (io_rollup_1s: the API's forwarding-node view, the partial "
        "intervals at the edges of fail-slow windows) is kept (migration 009).",
    )
    rollup_days: int = Field(
        default=90,
        ge=1,
        le=MAX_DAYS,
        description="Days the per-minute rollup (io_rollup_1m) and the forwarder rollups per minute and per 10 "
        "minutes (io_rollup_forwarder_1m, io_rollup_forwarder_10m) are kept (migrations 009, 014): what is "
        "left of a job's I/O over time once its raw records are gone, and what fail-slow detection's look-back "
        "windows (up to 96 h) read.",
    )
    system_days: int = Field(
        default=90,
        ge=1,
        le=MAX_DAYS,
        description="Days the other expiring tables are kept: target_metrics (the targets' per-interval "
        "metrics, 004), darshan_counters (imported Darshan counters, 003), anomalies and alert_log (the "
        "system-side diagnosis, 005), control_actions (the control loop's audit trail, 007).",
    )

    @field_validator("*", mode="before")
    @classmethod
    def _whole_days(cls, value: Any) -> Any:
        """``true`` in TOML would pass as 1 day (pydantic reads a bool as an int): refused."""
        if isinstance(value, bool):
            raise ValueError(f"a whole number of days (1-{MAX_DAYS}), not {value!r}")
        return value

    @model_validator(mode="after")
    def _rollups_outlive_raw(self) -> RetentionConfig:
        for msg in self.warnings():
            log.warning("[retention] %s", msg)
        return self

    def warnings(self) -> list[str]:
        """What this retention makes inconsistent, in words (empty: nothing)."""
        out = []
        if self.raw_days > self.rollup_days:
            out.append(
                f"raw_days = {self.raw_days} is more than rollup_days = {self.rollup_days}: the per-minute and "
                "forwarder rollups expire while the raw records they summarise are still stored, so the "
                "system-wide views and fail-slow detection (which read the rollups) show less than the job views "
                "for the days between"
            )
        return out

    def days_of(self, table: str) -> tuple[str, int] | None:
        """(setting, days) that applies to ``table`` (``T`` or a cluster's ``T_local``), or None."""
        base = table.removesuffix("_local")
        for setting, tables in RETENTION_TABLES.items():
            if base in tables:
                return setting, getattr(self, setting)
        return None


class _Store(Protocol):
    """What :func:`apply_retention` uses of :class:`pharos_core.store.Store`."""

    def query(self, sql: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]: ...

    def command(self, sql: str, params: dict[str, Any] | None = None) -> None: ...


_TTL = re.compile(r"\sTTL\s+(.+?)(?:\s+SETTINGS\s|$)", re.S)
_RULE = re.compile(r"^(?P<column>\S.*?)\s*\+\s*(?:toIntervalDay\((?P<d1>\d+)\)|INTERVAL\s+(?P<d2>\d+)\s+DAY)$", re.S)
_DISTRIBUTED = re.compile(r"^Distributed\('([A-Za-z_][\w-]*)'")


def ttl_clause(engine_full: str) -> str | None:
    """The TTL clause of a MergeTree table's ``system.tables.engine_full`` (``ingested +
    toIntervalDay(90)``), or None when it has none."""
    m = _TTL.search(engine_full)
    return m.group(1).strip() if m else None


def ttl_rule(clause: str) -> tuple[str, int] | None:
    """(column expression, days) of a TTL that is one ``column + N days`` rule (``ingested +
    toIntervalDay(90)``, ``ingested + INTERVAL 90 DAY``), or None for any other form (several
    rules, ``DELETE WHERE``, ``TO VOLUME``, months)."""
    m = _RULE.match(clause.strip())
    if m is None:
        return None
    return m.group("column"), int(m.group("d1") or m.group("d2"))


@dataclass(frozen=True)
class TableRetention:
    """One table's retention: what is in force and what the setting wants."""

    table: str  #: as in system.tables (``T``, or ``T_local`` on a cluster)
    setting: str  #: the [retention] field that applies (raw_days, ...)
    wanted_days: int  #: that field's value
    ttl: str | None  #: the TTL clause in force, None: no TTL
    days: int | None  #: its interval in days; None when it is not one ``column + N days`` rule
    statement: str | None  #: the ALTER that makes ``days`` the wanted ones; None when nothing is to do


def plan_retention(rows: list[dict[str, Any]], config: RetentionConfig) -> list[TableRetention]:
    """Each covered table of ``rows`` (``system.tables``: name, engine, engine_full) with the ALTER
    it needs, if any (a pure function: :func:`apply_retention` runs the statements). Tables of other
    engines (a cluster's Distributed ``T``, views) and tables not covered are left out."""
    by_name = {r["name"]: r for r in rows}
    out = []
    for r in sorted(rows, key=lambda r: r["name"]):
        hit = config.days_of(r["name"])
        if hit is None or not str(r["engine"]).endswith("MergeTree"):
            continue
        setting, wanted = hit
        clause = ttl_clause(r["engine_full"])
        rule = ttl_rule(clause) if clause else None
        stmt = None
        if rule is not None and rule[1] != wanted:
            on = ""
            dist = by_name.get(r["name"].removesuffix("_local")) if r["name"].endswith("_local") else None
            if dist is not None and dist["engine"] == "Distributed" and (m := _DISTRIBUTED.match(dist["engine_full"])):
                on = f" ON CLUSTER '{m.group(1)}'"
            stmt = f"ALTER TABLE {r['name']}{on} MODIFY TTL {rule[0]} + INTERVAL {wanted} DAY"
        out.append(TableRetention(r["name"], setting, wanted, clause, rule[1] if rule else None, stmt))
    return out


_TABLES_SQL = """
SELECT name, engine, engine_full FROM system.tables
WHERE database = currentDatabase() AND name IN {names:Array(String)}
"""


def retention_in_force(store: _Store, config: RetentionConfig | None = None) -> list[TableRetention]:
    """Every covered table of the store's database, its TTL in force and the setting's days
    (``config``, else the settings file and environment). Raises StoreError."""
    config = config or RetentionConfig()
    names = [n + s for tables in RETENTION_TABLES.values() for n in tables for s in ("", "_local")]
    return plan_retention(store.query(_TABLES_SQL, {"names": names}), config)


def apply_retention(store: _Store, config: RetentionConfig | None = None) -> list[TableRetention]:
    """Set each covered table's TTL to its setting (``config``, else the settings file and
    environment; see the module doc). Idempotent: a table whose TTL has the setting's interval
    gets no statement. Returns the tables changed, as they were before. Logs each change, and a
    warning for a table whose TTL it cannot read (left as it is). Raises StoreError; a
    ValidationError (a ValueError) for a bad setting, before anything is changed."""
    config = config or RetentionConfig()
    plan = retention_in_force(store, config)
    changed = []
    for t in plan:
        if t.statement is None:
            if t.days is None:
                log.warning(
                    "retention: %s has TTL %r, not one 'column + N days' rule: left as it is (%s = %d not applied)",
                    t.table,
                    t.ttl,
                    t.setting,
                    t.wanted_days,
                )
            continue
        store.command(t.statement)
        log.info(
            "retention: %s TTL from %d to %d days (%s): %s", t.table, t.days, t.wanted_days, t.setting, t.statement
        )
        changed.append(t)
    if plan:
        log.info("retention in force (days): %s", ", ".join(f"{t.table} {t.wanted_days}" for t in plan if t.days))
    return changed
