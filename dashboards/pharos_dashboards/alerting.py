"""Grafana alert rules (file provisioning format, provisioning/alerting/) for what the analytics
raise: fail-slow targets and forwarding nodes, interference, straggler resources, and control
actions that failed. Each rule: query A (ClickHouse SQL, table format, one row per alert
instance: string columns become labels, the one number the value) and threshold C (A > 0).

Alert queries run in Grafana's backend only: the plugin's backend macros ($__timeFilter ...)
apply, its front-end ones ($__conditionalAll, dashboard variables) do not exist there."""

from __future__ import annotations

from typing import Any

from pharos_analytics.alerts import ALERTNAMES

from .grafana import PLUGIN_VERSION, TABLE

DATASOURCE_UID = "pharos-clickhouse"
FOLDER = "Pharos"
WINDOW_S = 600  # each evaluation looks at the anomalies detected in the last 10 minutes


def failslow_sql(kind: str, label: str) -> str:
    return f"""
SELECT node AS {label}, argMax(severity, detected) AS severity, argMax(persistence, detected) AS persistence,
       argMax(ratio, detected) AS ratio
FROM anomalies
WHERE kind = '{kind}' AND $__timeFilter(detected)
GROUP BY node
HAVING argMax(active, detected) = 1
"""


RULES: tuple[dict[str, Any], ...] = (
    {
        "uid": "pharos-fail-slow-target",
        "title": ALERTNAMES["fail_slow_target"],
        "sql": failslow_sql("fail_slow_target", "target"),
        "columns": ("target", "severity", "persistence", "ratio"),
        "summary": "Storage target {{ $labels.target }} is fail-slow: {{ $values.A }}x its peers' service time per byte",
        "severity": "",
    },
    {
        "uid": "pharos-fail-slow-forwarder",
        "title": ALERTNAMES["fail_slow_forwarder"],
        "sql": failslow_sql("fail_slow_forwarder", "node"),
        "columns": ("node", "severity", "persistence", "ratio"),
        "summary": "Forwarding node {{ $labels.node }} is fail-slow: {{ $values.A }}x its peers' service time per byte",
        "severity": "",
    },
    {
        "uid": "pharos-interference",
        "title": ALERTNAMES["interference"],
        "sql": """
SELECT job_id AS job, culprit_job AS culprit, concat(node_type, ':', node) AS resource,
       argMax(severity, detected) AS severity, max(ratio) AS ratio
FROM anomalies
WHERE kind = 'interference' AND $__timeFilter(detected)
GROUP BY job_id, culprit_job, node_type, node
HAVING argMax(active, detected) = 1
""",
        "columns": ("job", "culprit", "resource", "severity", "ratio"),
        "summary": "Job {{ $labels.job }} slowed {{ $values.A }}x by job {{ $labels.culprit }} on {{ $labels.resource }}",
        "severity": "",
    },
    {
        "uid": "pharos-straggler-resource",
        "title": "PharosStragglerResource",
        "sql": """
SELECT job_id AS job, concat(node_type, ':', node) AS resource, max(ratio) AS ratio
FROM anomalies
WHERE kind = 'straggler_resource' AND $__timeFilter(detected)
GROUP BY job_id, node_type, node
""",
        "columns": ("job", "resource", "ratio"),
        "summary": "Job {{ $labels.job }}'s stragglers were made by {{ $labels.resource }} ({{ $values.A }}x its peers)",
        "severity": "warning",
    },
    {
        "uid": "pharos-control-failed",
        "title": "PharosControlActionFailed",
        "sql": """
SELECT kind, resource, job_id AS job, count() AS failures
FROM control_actions
WHERE $__timeFilter(time)
GROUP BY kind, resource, job_id
HAVING argMax(status, time) = 'failed'
""",
        "columns": ("kind", "resource", "job", "failures"),
        "summary": "The control loop could not apply {{ $labels.kind }} on {{ $labels.resource }} "
        "(job {{ $labels.job }}): the previous state keeps serving, retried",
        "severity": "warning",
    },
)


def rule(r: dict[str, Any]) -> dict[str, Any]:
    labels = {"source": "pharos-grafana"}
    if r["severity"]:  # otherwise the query's severity column is the label
        labels["severity"] = r["severity"]
    return {
        "uid": r["uid"],
        "title": r["title"],
        "condition": "C",
        "data": [
            {
                "refId": "A",
                "relativeTimeRange": {"from": WINDOW_S, "to": 0},
                "datasourceUid": DATASOURCE_UID,
                "model": {
                    "editorType": "sql",
                    "format": TABLE,
                    "intervalMs": 1000,
                    "maxDataPoints": 43200,
                    "pluginVersion": PLUGIN_VERSION,
                    "queryType": "table",
                    "rawSql": r["sql"].strip(),
                    "refId": "A",
                },
            },
            {
                "refId": "C",
                "relativeTimeRange": {"from": 0, "to": 0},
                "datasourceUid": "__expr__",
                "model": {
                    "conditions": [{"evaluator": {"params": [0], "type": "gt"}, "type": "query"}],
                    "datasource": {"type": "__expr__", "uid": "__expr__"},
                    "expression": "A",
                    "refId": "C",
                    "type": "threshold",
                },
            },
        ],
        "noDataState": "OK",
        "execErrState": "Error",
        "for": "0s",
        "annotations": {
            "summary": r["summary"],
            "dashboardUId": "pharos-anomalies",
            "description": "Raised from the anomalies Pharos's detection loop stored (docs/diagnosis.md, docs/dashboards.md).",
        },
        "labels": labels,
        "isPaused": False,
    }


def alert_rules() -> dict[str, Any]:
    return {
        "apiVersion": 1,
        "groups": [
            {
                "orgId": 1,
                "name": "pharos",
                "folder": FOLDER,
                "interval": "1m",
                "rules": [rule(r) for r in RULES],
            }
        ],
    }


def _datasources(ds: dict[str, Any]) -> dict[str, Any]:
    """A data source provisioning file of one data source."""
    return {"apiVersion": 1, "datasources": [ds]}


def datasources() -> dict[str, Any]:
    return _datasources(
        {
            "name": "Pharos ClickHouse",
            "uid": DATASOURCE_UID,
            "type": "grafana-clickhouse-datasource",
            "isDefault": True,
            "editable": False,
            "jsonData": {
                "host": "${PHAROS_CLICKHOUSE_HOST}",
                "port": 8123,
                "protocol": "http",
                "secure": False,
                "username": "${PHAROS_CLICKHOUSE_USER}",
                "defaultDatabase": "pharos",
                "dialTimeout": "10",
                "queryTimeout": "60",
            },
            "secureJsonData": {"password": "${PHAROS_CLICKHOUSE_PASSWORD}"},
        }
    )


#: The Prometheus that scrapes Pharos's own metrics (deploy/prometheus/prometheus.yml): the Pharos
#: health dashboard reads it.
PROMETHEUS_UID = "pharos-prometheus"
#: Prometheus's scrape interval in deploy/prometheus/prometheus.yml: Grafana's $__rate_interval is
#: at least four of these.
SCRAPE_INTERVAL = "15s"


def prometheus_datasources() -> dict[str, Any]:
    return _datasources(
        {
            "name": "Pharos Prometheus",
            "uid": PROMETHEUS_UID,
            "type": "prometheus",
            "access": "proxy",
            "url": "${PHAROS_PROMETHEUS_URL}",
            "isDefault": False,
            "editable": False,
            "jsonData": {"httpMethod": "POST", "timeInterval": SCRAPE_INTERVAL},
        }
    )


def dashboard_providers() -> dict[str, Any]:
    return {
        "apiVersion": 1,
        "providers": [
            {
                "name": "pharos",
                "orgId": 1,
                "folder": FOLDER,
                "folderUid": "pharos",
                "type": "file",
                "disableDeletion": False,
                "allowUiUpdates": False,
                "updateIntervalSeconds": 60,
                "options": {"path": "/var/lib/grafana/dashboards/pharos", "foldersFromFilesStructure": False},
            }
        ],
    }
