//! Prometheus text exposition on a loopback HTTP port (tiny_http, one thread).
use std::sync::{Arc, Mutex};

use anyhow::{anyhow, Result};
use pharos_wire::sink::SinkStats;

use crate::record::{KernelCounters, Stats};

pub struct Server {
    text: Arc<Mutex<String>>,
}

impl Server {
    /// Serves GET /metrics on `addr` ("" = no server; `update` still works).
    pub fn start(addr: &str) -> Result<Server> {
        let text = Arc::new(Mutex::new(String::new()));
        if !addr.is_empty() {
            let server = tiny_http::Server::http(addr).map_err(|e| anyhow!("metrics listener {addr}: {e}"))?;
            let t = text.clone();
            std::thread::Builder::new().name("pharos-metrics".into()).spawn(move || {
                for req in server.incoming_requests() {
                    let body = t.lock().unwrap().clone();
                    let header =
                        tiny_http::Header::from_bytes(&b"Content-Type"[..], &b"text/plain; version=0.0.4"[..]).unwrap();
                    let _ = req.respond(tiny_http::Response::from_string(body).with_header(header));
                }
            })?;
        }
        Ok(Server { text })
    }

    pub fn update(&self, s: &Stats, k: &KernelCounters, sink: Option<SinkStats>) {
        *self.text.lock().unwrap() = render(s, k, sink.as_ref());
    }
}

/// Renders the counters in Prometheus text format.
pub fn render(s: &Stats, k: &KernelCounters, sink: Option<&SinkStats>) -> String {
    let mut o = String::new();
    let mut counter = |name: &str, help: &str, v: u64| {
        o += &format!(
            "# HELP pharos_agent_{name} {help}\n# TYPE pharos_agent_{name} counter\npharos_agent_{name} {v}\n"
        );
    };
    counter("records_received_total", "Records read from the kernel ring buffer.", s.records_received);
    counter("ringbuf_drops_total", "Records the kernel could not put in the ring buffer.", k.ringbuf_drops);
    counter(
        "unmerged_fallbacks_total",
        "Requests emitted unmerged because the per-thread map was full.",
        k.unmerged_fallbacks,
    );
    let ss = sink.cloned().unwrap_or_default();
    counter("records_sent_total", "Records Kafka acknowledged.", ss.records_sent);
    counter("batches_sent_total", "Batches Kafka acknowledged.", ss.batches_sent);
    counter("overflow_drops_total", "Records dropped because the sink queue was full.", ss.overflow_drops);
    counter("delivery_failures_total", "Records in batches Kafka did not accept.", ss.delivery_failures);
    o += "# HELP pharos_agent_requests_total Requests seen (merged records count each request).\n# TYPE pharos_agent_requests_total counter\n";
    for (op, (n, _)) in &s.per_op {
        o += &format!("pharos_agent_requests_total{{op=\"{op}\"}} {n}\n");
    }
    o += "# HELP pharos_agent_bytes_total Bytes moved (max(result,0) * count).\n# TYPE pharos_agent_bytes_total counter\n";
    for (op, (_, b)) in &s.per_op {
        o += &format!("pharos_agent_bytes_total{{op=\"{op}\"}} {b}\n");
    }
    o
}
