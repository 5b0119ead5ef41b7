"""Grafana dashboard JSON (schemaVersion 41) for the ClickHouse data source plugin, as plain dicts.

Plain dicts, not grafana-foundation-sdk: the SDK has no query or annotation type for
grafana-clickhouse-datasource (its ``AnnotationTarget`` is Grafana's built-in one) and no writer
of the alerting file-provisioning format, so every Pharos query would go through hand-made
variants anyway. What the SDK's types would guarantee is checked instead by type-checking the
generated JSON against ``@grafana/schema`` with ``tsc --strict`` (tests/dashboards).

Conventions of the plugin's own dashboards: a ``datasource`` variable of type datasource, every
query ``{"type": PLUGIN, "uid": "${datasource}"}``, raw SQL (``editorType`` sql), query variables
with multi-select and All filtered by ``$__conditionalAll(cond, $var)``.

Pharos's own health (self-monitoring) reads Prometheus instead: a board made with
``datasource=PROMETHEUS`` has a ``datasource`` variable of that type, and its panels
(:meth:`Board.prom_panel`) hold PromQL queries (:func:`prom_target`, the Prometheus data source's
query model in code mode).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

PLUGIN = "grafana-clickhouse-datasource"
PLUGIN_VERSION = "4.20.0"  # the plugin version the dashboards were written for (query model v4)
DS = {"type": PLUGIN, "uid": "${datasource}"}
#: sqlds's format option: 0 time series (long frames become wide, one series per string column value), 1 table.
TIME_SERIES, TABLE = 0, 1
SCHEMA_VERSION = 41


PROMETHEUS = "prometheus"  # Grafana's built-in Prometheus data source
PROM_DS = {"type": PROMETHEUS, "uid": "${datasource}"}


def prom_target(expr: str, legend: str, ref: str) -> dict[str, Any]:
    """One Prometheus query (PromQuery) over the panel's time range; ``legend`` names each series
    (``{{label}}`` is replaced by the series' label)."""
    return {
        "datasource": PROM_DS,
        "editorMode": "code",
        "expr": expr.strip(),
        "legendFormat": legend,
        "range": True,
        "refId": ref,
    }


def target(sql: str, fmt: int, ref: str = "A") -> dict[str, Any]:
    """One plugin query (CHSqlQuery)."""
    return {
        "datasource": DS,
        "editorType": "sql",
        "format": fmt,
        "pluginVersion": PLUGIN_VERSION,
        "queryType": "timeseries" if fmt == TIME_SERIES else "table",
        "rawSql": sql.strip(),
        "refId": ref,
    }


def datasource_variable(plugin: str = PLUGIN) -> dict[str, Any]:
    return {
        "current": {"text": "", "value": ""},
        "hide": 0,
        "includeAll": False,
        "label": "Data source",
        "multi": False,
        "name": "datasource",
        "options": [],
        "query": plugin,
        "refresh": 1,
        "regex": "",
        "type": "datasource",
    }


def query_variable(name: str, label: str, sql: str, *, multi: bool = True, include_all: bool = True) -> dict[str, Any]:
    """A query variable; the first column is the value (the plugin's convention). With
    multi-select and All, panels filter with ``$__conditionalAll(col IN (${name}), $name)``."""
    return {
        "current": {"text": ["All"], "value": ["$__all"]} if include_all else {"text": "", "value": ""},
        "datasource": DS,
        "hide": 0,
        "includeAll": include_all,
        "label": label,
        "multi": multi,
        "name": name,
        "options": [],
        "query": {"editorType": "sql", "rawSql": sql.strip()},
        "refresh": 2,
        "regex": "",
        "sort": 3 if not multi else 1,
        "type": "query",
    }


def custom_variable(name: str, label: str, values: list[str], default: str) -> dict[str, Any]:
    return {
        "current": {"text": default, "value": default},
        "hide": 0,
        "includeAll": False,
        "label": label,
        "multi": False,
        "name": name,
        "options": [{"selected": v == default, "text": v, "value": v} for v in values],
        "query": ",".join(values),
        "type": "custom",
    }


def annotation(name: str, sql: str, color: str, *, enable: bool = True) -> dict[str, Any]:
    """A plugin annotation query: columns time, timeEnd, title, text, tags (comma-separated)."""
    return {
        "datasource": DS,
        "enable": enable,
        "hide": False,
        "iconColor": color,
        "name": name,
        "target": target(sql, TABLE, "Anno"),
    }


BUILTIN_ANNOTATIONS = {
    "builtIn": 1,
    "datasource": {"type": "grafana", "uid": "-- Grafana --"},
    "enable": True,
    "hide": True,
    "iconColor": "rgba(0, 211, 255, 1)",
    "name": "Annotations & Alerts",
    "type": "dashboard",
}

# Options of each panel type with the fields @grafana/schema requires.
LEGEND = {"calcs": ["mean", "max"], "displayMode": "table", "placement": "right", "showLegend": True}
TOOLTIP = {"hideZeros": False, "mode": "multi", "sort": "desc"}
OPTIONS: dict[str, dict[str, Any]] = {
    "timeseries": {"legend": LEGEND, "tooltip": TOOLTIP},
    "table": {"cellHeight": "sm", "frameIndex": 0, "showHeader": True},
    "stat": {
        "colorMode": "value",
        "graphMode": "none",
        "justifyMode": "auto",
        "orientation": "auto",
        "percentChangeColorMode": "standard",
        "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
        "showPercentChange": False,
        "textMode": "value_and_name",
        "wideLayout": True,
    },
    "heatmap": {
        "calculate": False,
        "cellGap": 0,
        "color": {
            "exponent": 0.5,
            "fill": "dark-orange",
            "mode": "scheme",
            "reverse": False,
            "scale": "exponential",
            "scheme": "Oranges",
            "steps": 64,
        },
        "exemplars": {"color": "rgba(255,0,255,0.7)"},
        "filterValues": {"le": 1e-9},
        "legend": {"show": True},
        "rowsFrame": {"layout": "unknown"},
        "showValue": "never",
        "tooltip": {"mode": "single", "showColorScale": True, "yHistogram": False},
        "yAxis": {"axisPlacement": "left", "reverse": False},
    },
    "barchart": {
        "barWidth": 0.8,
        "fullHighlight": False,
        "groupWidth": 0.7,
        "legend": {"calcs": [], "displayMode": "list", "placement": "bottom", "showLegend": True},
        "orientation": "auto",
        "showValue": "auto",
        "stacking": "none",
        "tooltip": {"hideZeros": False, "mode": "multi", "sort": "none"},
        "xTickLabelMaxLength": 0,
        "xTickLabelRotation": 0,
    },
    "state-timeline": {
        "alignValue": "left",
        "legend": {"calcs": [], "displayMode": "list", "placement": "bottom", "showLegend": True},
        "mergeValues": True,
        "rowHeight": 0.9,
        "showValue": "never",
        "tooltip": {"hideZeros": False, "mode": "single", "sort": "none"},
    },
    "text": {"mode": "markdown"},
}


@dataclass
class Board:
    """A dashboard being built: panels flow left to right in a 24-column grid.

    ``columns`` records, per panel title, the columns its query must return (checked by
    tests/dashboards on chDB; not part of the JSON). ``datasource``: the data source type of
    every query (the ClickHouse plugin, or :data:`PROMETHEUS`)."""

    uid: str
    title: str
    description: str
    tags: list[str]
    datasource: str = PLUGIN
    variables: list[dict[str, Any]] = field(default_factory=list)
    annotations: list[dict[str, Any]] = field(default_factory=list)
    panels: list[dict[str, Any]] = field(default_factory=list)
    columns: dict[str, tuple[str, ...]] = field(default_factory=dict)
    links: list[dict[str, Any]] = field(default_factory=list)
    time_from: str = "now-6h"
    refresh: str = "30s"
    _x: int = 0
    _y: int = 0
    _row_h: int = 0

    def _place(self, w: int, h: int) -> dict[str, int]:
        if self._x + w > 24:
            self._x, self._y, self._row_h = 0, self._y + self._row_h, 0
        pos = {"h": h, "w": w, "x": self._x, "y": self._y}
        self._x += w
        self._row_h = max(self._row_h, h)
        return pos

    def row(self, title: str) -> None:
        if self._x:
            self._x, self._y, self._row_h = 0, self._y + self._row_h, 0
        self.panels.append(
            {
                "collapsed": False,
                "gridPos": {"h": 1, "w": 24, "x": 0, "y": self._y},
                "id": len(self.panels) + 1,
                "panels": [],
                "title": title,
                "type": "row",
            }
        )
        self._y += 1

    def panel(self, kind: str, title: str, sql: str, columns: tuple[str, ...], **look: Any) -> None:
        """A panel of one SQL query that must return ``columns``; ``look``: :meth:`_add`'s
        keywords (size, description, unit, options, field defaults and overrides)."""
        fmt = TIME_SERIES if kind in ("timeseries", "heatmap", "state-timeline") else TABLE
        if title in self.columns:
            raise ValueError(f"{self.uid}: two panels titled {title!r}")
        self.columns[title] = columns
        self._add(kind, title, [target(sql, fmt)], **look)

    def prom_panel(self, kind: str, title: str, queries: list[tuple[str, str]], **look: Any) -> None:
        """A panel of PromQL ``queries``, each (expression, legend), refIds A, B, ... (a board
        made with ``datasource=PROMETHEUS``); ``look`` as for :meth:`panel`."""
        if self.datasource != PROMETHEUS:
            raise ValueError(f"{self.uid}: a Prometheus panel on a {self.datasource} board")
        if title in {p["title"] for p in self.panels}:
            raise ValueError(f"{self.uid}: two panels titled {title!r}")
        targets = [prom_target(expr, legend, chr(ord("A") + i)) for i, (expr, legend) in enumerate(queries)]
        self._add(kind, title, targets, **look)

    def _add(
        self,
        kind: str,
        title: str,
        targets: list[dict[str, Any]],
        *,
        w: int = 12,
        h: int = 8,
        description: str = "",
        unit: str | None = None,
        options: dict[str, Any] | None = None,
        defaults: dict[str, Any] | None = None,
        overrides: list[dict[str, Any]] | None = None,
    ) -> None:
        fd: dict[str, Any] = dict(defaults or {})
        if unit:
            fd["unit"] = unit
        self.panels.append(
            {
                "datasource": targets[0]["datasource"],
                "description": description,
                "fieldConfig": {"defaults": fd, "overrides": overrides or []},
                "gridPos": self._place(w, h),
                "id": len(self.panels) + 1,
                "options": {**OPTIONS[kind], **(options or {})},
                "pluginVersion": "12.1.0",
                "targets": targets,
                "title": title,
                "type": kind,
            }
        )

    def text(self, title: str, content: str, *, w: int = 24, h: int = 3) -> None:
        self.panels.append(
            {
                "gridPos": self._place(w, h),
                "id": len(self.panels) + 1,
                "options": {**OPTIONS["text"], "content": content.strip()},
                "title": title,
                "type": "text",
            }
        )

    def json(self) -> dict[str, Any]:
        return {
            "annotations": {"list": [BUILTIN_ANNOTATIONS, *self.annotations]},
            "description": self.description,
            "editable": True,
            "fiscalYearStartMonth": 0,
            "graphTooltip": 1,
            "links": self.links,
            "panels": self.panels,
            "refresh": self.refresh,
            "schemaVersion": SCHEMA_VERSION,
            "tags": self.tags,
            "templating": {"list": [datasource_variable(self.datasource), *self.variables]},
            "time": {"from": self.time_from, "to": "now"},
            "timepicker": {},
            "timezone": "browser",
            "title": self.title,
            "uid": self.uid,
            "version": 1,
        }


def job_link(field_name: str) -> dict[str, Any]:
    """A field override linking a job id column to the Job dashboard, keeping the time range."""
    return {
        "matcher": {"id": "byName", "options": field_name},
        "properties": [
            {
                "id": "links",
                "value": [
                    {
                        "title": "Job ${__value.raw}",
                        "url": "/d/pharos-job/pharos-job?var-job=${__value.raw}&${__url_time_range}&${datasource:queryparam}",
                    }
                ],
            }
        ],
    }


def unit_override(field_name: str, unit: str) -> dict[str, Any]:
    return {"matcher": {"id": "byName", "options": field_name}, "properties": [{"id": "unit", "value": unit}]}


def series_name(label: str) -> dict[str, Any]:
    """Field defaults naming each wide series (the plugin turns long frames into wide ones, one
    field per value of the string column, labelled with it) by that label."""
    return {"displayName": "${__field.labels." + label + "}"}
