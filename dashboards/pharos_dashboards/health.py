"""The Pharos health dashboard: Pharos's own metrics (docs/dashboards.md "Self-monitoring"), as
Prometheus scrapes them with deploy/prometheus/prometheus.yml (jobs pharos-server, pharos-agent,
pharos-fwd, pharos-mount). Every query is PromQL on the families of pharos_core.telemetry,
agents/ebpf/src/metrics.rs, forwarder/fwd/src/admin.rs and forwarder/mount/src/main.rs;
tests/e2e/test_self_monitoring.py runs each one on a real Prometheus scraping a real stack."""

from __future__ import annotations

from .boards.common import board
from .grafana import PROMETHEUS, Board

RATE = "$__rate_interval"


def _sum(expr: str, by: str) -> str:
    return f"sum by ({by}) ({expr})" if by else f"sum({expr})"


def rate(metric: str, by: str = "") -> str:
    """Per-second rate of a counter, summed (by the labels ``by``)."""
    return _sum(f"rate({metric}[{RATE}])", by)


def increase(metric: str, by: str = "") -> str:
    """What a counter added over the rate interval, summed (by the labels ``by``)."""
    return _sum(f"increase({metric}[{RATE}])", by)


def quantile(q: float, histogram: str, by: str) -> str:
    """The ``q`` quantile of a histogram's observations over the rate interval, by ``by``."""
    return f"histogram_quantile({q}, sum by (le, {by}) (rate({histogram}_bucket[{RATE}])))"


def p50_p99(histogram: str, by: str) -> list[tuple[str, str]]:
    return [
        (quantile(0.5, histogram, by), f"p50 {{{{{by}}}}}"),
        (quantile(0.99, histogram, by), f"p99 {{{{{by}}}}}"),
    ]


UP_MAPPINGS = [
    {
        "type": "value",
        "options": {
            "0": {"text": "down", "color": "red", "index": 0},
            "1": {"text": "up", "color": "green", "index": 1},
        },
    }
]


def health() -> Board:
    b = board(
        "pharos-health",
        "Pharos health",
        "Pharos's own metrics (Prometheus): ingest in and out, consumer lag, loss, store and loop "
        "latency, API latency, the forwarding layer's queues and failures, scrape targets.",
        datasource=PROMETHEUS,
    )
    b.time_from = "now-1h"

    b.row("Ingest: producers → Kafka → pipeline → store")
    b.prom_panel(
        "timeseries",
        "Records in and out",
        [
            (rate("pharos_agent_records_sent_total"), "eBPF agents → Kafka"),
            (rate("pharos_fwd_records_sent_total"), "forwarding daemons → Kafka"),
            (rate("pharos_pipeline_messages_total", "topic"), "consumed {{topic}} (messages)"),
            (rate("pharos_pipeline_records_stored_total", "topic"), "stored from {{topic}} (rows)"),
        ],
        unit="cps",
        description="Records Kafka acknowledged to the producers, messages the pipeline consumed and rows it "
        "stored, per second. Stored rows well below the records sent mean a backlog (see the lag) or loss.",
    )
    b.prom_panel(
        "timeseries",
        "Consumer lag",
        [("sum by (topic) (pharos_pipeline_consumer_lag)", "{{topic}}")],
        unit="short",
        description="Messages in Kafka the pipeline's consumer group has not committed yet (high watermark minus "
        "committed offset, summed over the partitions). Growing: the store or the pipeline does not keep up.",
    )

    b.row("Loss: nothing is dropped silently")
    b.prom_panel(
        "timeseries",
        "Drops and dead letters",
        [
            (increase("pharos_agent_ringbuf_drops_total"), "agent ring buffer"),
            (increase("pharos_agent_overflow_drops_total"), "agent sink overflow"),
            (increase("pharos_agent_delivery_failures_total"), "agent Kafka delivery failures"),
            (increase("pharos_fwd_records_dropped_total", "reason"), "forwarding daemons: {{reason}}"),
            (increase("pharos_pipeline_dead_letters_total", "topic"), "dead letters from {{topic}}"),
            (increase("pharos_pipeline_missing_batches_total", "topic"), "batches missing in {{topic}}"),
            (increase("pharos_pipeline_poll_errors_total"), "pipeline polls failed (retried)"),
        ],
        w=24,
        unit="short",
        description="Records lost or set aside per rate interval: by the kernel (ring buffer full), by a "
        "producer's bounded queue or Kafka, messages that did not decode (dead letters), batches a producer sent "
        "that never arrived (seq gaps). Every one is also in the job summary's dropped_records or dead_letters.",
    )

    b.row("Store and analytics")
    b.prom_panel(
        "timeseries",
        "Store insert latency",
        p50_p99("pharos_store_insert_seconds", "table"),
        unit="s",
        description="Time of one INSERT into chDB or the ClickHouse server, by table (p50, p99).",
    )
    b.prom_panel(
        "timeseries",
        "Detection and control cycle time",
        p50_p99("pharos_loop_cycle_seconds", "loop"),
        unit="s",
        description="Time of a completed cycle of the detection loop (fail-slow, interference, alerts) and of the "
        "control loop (DFRA, remapping, placement). Near the period ([diagnosis] detect_period_s, [control] "
        "period_s): the loop cannot keep its period.",
    )
    b.prom_panel(
        "timeseries",
        "Loop cycles and failures",
        [
            (increase("pharos_loop_cycle_seconds_count", "loop"), "cycles {{loop}}"),
            (increase("pharos_loop_cycle_failures_total", "loop"), "failed {{loop}}"),
        ],
        w=24,
        h=6,
        unit="short",
        description="Cycles completed and cycles that raised (logged by pharos serve; the loop goes on).",
    )

    b.row("API")
    b.prom_panel(
        "timeseries",
        "API latency p99 by route",
        [(quantile(0.99, "pharos_api_request_duration_seconds", "route"), "{{route}}")],
        unit="s",
        description="99th percentile of the time from a request's arrival to the end of its response, by route "
        "template (e.g. /v1/jobs/{job_id}).",
    )
    b.prom_panel(
        "timeseries",
        "API requests by status",
        [(rate("pharos_api_request_duration_seconds_count", "status"), "{{status}}")],
        unit="reqps",
    )

    b.row("Forwarding layer")
    b.prom_panel(
        "timeseries",
        "Forwarding daemons: mean queue wait",
        [
            (
                f"{rate('pharos_fwd_queue_wait_seconds_total', 'instance')} / "
                f"{rate('pharos_fwd_dequeued_requests_total', 'instance')}",
                "{{instance}}",
            )
        ],
        unit="s",
        description="Mean time a data request waited in a target queue of the daemon before a worker took it "
        "(Little's law: the queues' depth integrated over time, per request that left them).",
    )
    b.prom_panel(
        "timeseries",
        "Forwarding daemons: service time",
        p50_p99("pharos_fwd_service_seconds", "op"),
        unit="s",
        description="Execution and reply of requests with a storage target, by kind (read, write, metadata).",
    )
    b.prom_panel(
        "timeseries",
        "Forwarding daemons: requests by class",
        [(rate("pharos_fwd_requests_total", "class"), "{{class}}")],
        unit="reqps",
    )
    b.prom_panel(
        "timeseries",
        "Forwarding daemons: reply failures and errors",
        [
            (increase("pharos_fwd_replies_not_sent_total", "instance"), "replies not sent {{instance}}"),
            (increase("pharos_fwd_request_errors_total", "instance"), "error replies {{instance}}"),
            (increase("pharos_fwd_worker_panics_total", "instance"), "worker panics {{instance}}"),
        ],
        unit="short",
        description="Replies a daemon could not send (the client replays on another node), requests answered "
        "with an error, and requests whose execution panicked, per rate interval.",
    )
    b.prom_panel(
        "timeseries",
        "FUSE mounts: requests per forwarding node",
        [(rate("pharos_mount_requests_total", "node"), "{{node}}")],
        unit="reqps",
    )
    b.prom_panel(
        "timeseries",
        "FUSE mounts: failovers and failures",
        [
            (increase("pharos_mount_failovers_total"), "failovers"),
            (increase("pharos_mount_request_failures_total", "node"), "failures {{node}}"),
        ],
        unit="short",
        description="Requests tried on another forwarding node than their first, and requests a node did not "
        "answer, per rate interval.",
    )

    b.row("Scrape targets")
    b.prom_panel(
        "state-timeline",
        "Targets up",
        [("up", "{{job}} {{instance}}")],
        w=24,
        h=6,
        defaults={"mappings": UP_MAPPINGS},
        description="Whether Prometheus could scrape each Pharos target (1 up, 0 down), per job.",
    )
    return b
