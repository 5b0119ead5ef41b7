//! Prometheus metrics on a loopback HTTP port (tiny_http, one thread), encoded by the official
//! `prometheus-client` crate (OpenMetrics text). The values are the agent's own counters
//! ([`Stats`], [`KernelCounters`], the sink's [`SinkStats`]): [`Server::update`] keeps a copy of
//! the newest, and a collector turns it into metric families at each scrape.
use std::fmt;
use std::sync::{Arc, Mutex};

use anyhow::{anyhow, Result};
use pharos_wire::sink::SinkStats;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::info::Info;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use crate::record::{KernelCounters, Stats};

/// The Content-Type of [`render`]'s text.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[derive(Clone, Debug, Default)]
struct Snapshot {
    stats: Stats,
    kernel: KernelCounters,
    sink: SinkStats,
}

/// The newest counters as metric families (names `pharos_agent_*`, counters end in `_total`).
#[derive(Debug)]
struct AgentCollector(Arc<Mutex<Snapshot>>);

fn counter(enc: &mut DescriptorEncoder, name: &str, help: &str, v: u64) -> fmt::Result {
    let c = ConstCounter::new(v);
    c.encode(enc.encode_descriptor(name, help, None, c.metric_type())?)
}

impl Collector for AgentCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> fmt::Result {
        let s = self.0.lock().unwrap().clone();
        let e = &mut enc;
        counter(
            e,
            "pharos_agent_records_received",
            "Records read from the kernel ring buffer",
            s.stats.records_received,
        )?;
        counter(
            e,
            "pharos_agent_ringbuf_drops",
            "Records the kernel could not put in the ring buffer",
            s.kernel.ringbuf_drops,
        )?;
        counter(
            e,
            "pharos_agent_unmerged_fallbacks",
            "Requests emitted unmerged because the per-thread map was full",
            s.kernel.unmerged_fallbacks,
        )?;
        counter(e, "pharos_agent_records_sent", "Records Kafka acknowledged", s.sink.records_sent)?;
        counter(e, "pharos_agent_batches_sent", "Batches Kafka acknowledged", s.sink.batches_sent)?;
        counter(
            e,
            "pharos_agent_overflow_drops",
            "Records dropped because the sink queue was full",
            s.sink.overflow_drops,
        )?;
        counter(
            e,
            "pharos_agent_delivery_failures",
            "Records in batches Kafka did not accept",
            s.sink.delivery_failures,
        )?;
        let help = "Requests seen (merged records count each request)";
        let mut f = e.encode_descriptor("pharos_agent_requests", help, None, MetricType::Counter)?;
        for (op, (n, _)) in &s.stats.per_op {
            ConstCounter::new(*n).encode(f.encode_family(&[("op", *op)])?)?;
        }
        let help = "Bytes moved (max(result,0) * count)";
        let mut f = e.encode_descriptor("pharos_agent_bytes", help, None, MetricType::Counter)?;
        for (op, (_, b)) in &s.stats.per_op {
            ConstCounter::new(*b).encode(f.encode_family(&[("op", *op)])?)?;
        }
        Ok(())
    }
}

/// The agent's registry: its counters as of the newest `snapshot`, and its build.
fn registry(snapshot: Arc<Mutex<Snapshot>>) -> Registry {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(AgentCollector(snapshot)));
    let build = Info::new([("service", "agent"), ("version", env!("CARGO_PKG_VERSION"))]);
    registry.register("pharos_build", "The running Pharos component and its version", build);
    registry
}

pub struct Server {
    snapshot: Arc<Mutex<Snapshot>>,
}

impl Server {
    /// Serves GET /metrics on `addr` ("" = no server; `update` still works).
    pub fn start(addr: &str) -> Result<Server> {
        let snapshot = Arc::new(Mutex::new(Snapshot::default()));
        if !addr.is_empty() {
            let server = tiny_http::Server::http(addr).map_err(|e| anyhow!("metrics listener {addr}: {e}"))?;
            let reg = registry(snapshot.clone());
            std::thread::Builder::new().name("pharos-metrics".into()).spawn(move || {
                for req in server.incoming_requests() {
                    let header = tiny_http::Header::from_bytes(&b"Content-Type"[..], CONTENT_TYPE.as_bytes()).unwrap();
                    let _ = req.respond(tiny_http::Response::from_string(render(&reg)).with_header(header));
                }
            })?;
        }
        Ok(Server { snapshot })
    }

    pub fn update(&self, s: &Stats, k: &KernelCounters, sink: Option<SinkStats>) {
        *self.snapshot.lock().unwrap() =
            Snapshot { stats: s.clone(), kernel: k.clone(), sink: sink.unwrap_or_default() };
    }
}

/// The registry's metrics in the OpenMetrics text format ([`CONTENT_TYPE`]).
pub fn render(registry: &Registry) -> String {
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, registry).expect("writing to a String");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_keep_their_names_and_values() {
        let m = Server::start("").unwrap();
        let mut s = Stats { records_received: 7, ..Default::default() };
        s.per_op.insert("pwrite", (5, 4096));
        let k = KernelCounters { ringbuf_drops: 2, unmerged_fallbacks: 1 };
        let sink = SinkStats {
            records_sent: 6,
            batches_sent: 3,
            overflow_drops: 4,
            delivery_failures: 9,
            ..Default::default()
        };
        m.update(&s, &k, Some(sink));
        let t = render(&registry(m.snapshot.clone()));
        for line in [
            "# TYPE pharos_agent_records_received counter",
            "pharos_agent_records_received_total 7",
            "pharos_agent_ringbuf_drops_total 2",
            "pharos_agent_unmerged_fallbacks_total 1",
            "pharos_agent_records_sent_total 6",
            "pharos_agent_batches_sent_total 3",
            "pharos_agent_overflow_drops_total 4",
            "pharos_agent_delivery_failures_total 9",
            "pharos_agent_requests_total{op=\"pwrite\"} 5",
            "pharos_agent_bytes_total{op=\"pwrite\"} 4096",
            "pharos_build_info{service=\"agent\",version=\"0.1.0\"} 1",
        ] {
            assert!(t.lines().any(|l| l == line), "{line:?} missing from\n{t}");
        }
        assert!(t.ends_with("# EOF\n"));
    }

    #[test]
    fn served_over_http() {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let m = Server::start(&format!("127.0.0.1:{port}")).unwrap();
        m.update(&Stats { records_received: 11, ..Default::default() }, &KernelCounters::default(), None);
        use std::io::{Read, Write};
        let mut c = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        c.write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n").unwrap();
        let mut reply = String::new();
        c.read_to_string(&mut reply).unwrap();
        assert!(reply.contains(&format!("Content-Type: {CONTENT_TYPE}")), "{reply}");
        assert!(reply.contains("\npharos_agent_records_received_total 11\n"), "{reply}");
    }
}
