//! The counters of Gather-Arrange-Scatter and of the write path: `GET /status` and
//! `GET /metrics`.
use std::collections::BTreeMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use super::super::Backend;
use super::REASONS;

/// Counters of GAS and of the write path (GET /status).
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct GasView {
    pub enabled: bool,
    pub client_writes: u64,
    pub backend_write_requests: u64,
    pub gathered: u64,
    pub kept: u64,
    pub merged: u64,
    pub runs: u64,
    pub bytes: u64,
    pub buffered_bytes: u64,
    pub deferred_errors: u64,
    pub flushes: BTreeMap<&'static str, u64>,
}

impl GasView {
    /// The write path's counters and GAS's of backend `b`.
    pub fn of(b: &Backend) -> GasView {
        let mut v = GasView {
            client_writes: b.data.client_writes.load(Relaxed),
            backend_write_requests: b.data.data_writes.load(Relaxed),
            ..Default::default()
        };
        if let Some(g) = b.gas.get() {
            let s = &g.stats;
            v.enabled = true;
            v.gathered = s.gathered.load(Relaxed);
            v.kept = s.kept.load(Relaxed);
            v.merged = s.merged.load(Relaxed);
            v.runs = s.runs.load(Relaxed);
            v.bytes = s.bytes.load(Relaxed);
            v.deferred_errors = s.deferred_errors.load(Relaxed);
            v.buffered_bytes = g.buffered() as u64;
            v.flushes = REASONS.iter().zip(&s.flushes).map(|(r, c)| (*r, c.load(Relaxed))).collect();
        }
        v
    }
}

/// Client writes received and write requests issued to the targets (always), and the GAS
/// counters (when on), in `GET /metrics`.
pub struct GasCollector(pub Arc<Backend>);

impl std::fmt::Debug for GasCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("GasCollector")
    }
}

impl prometheus_client::collector::Collector for GasCollector {
    fn encode(&self, mut e: prometheus_client::encoding::DescriptorEncoder) -> std::fmt::Result {
        use prometheus_client::encoding::EncodeMetric;
        use prometheus_client::metrics::counter::ConstCounter;
        use prometheus_client::metrics::gauge::ConstGauge;
        let v = GasView::of(&self.0);
        let one = |e: &mut prometheus_client::encoding::DescriptorEncoder, name: &str, help: &str, x: u64| {
            let c = ConstCounter::new(x);
            c.encode(e.encode_descriptor(name, help, None, c.metric_type())?)
        };
        one(&mut e, "pharos_fwd_client_writes", "Write requests received from clients", v.client_writes)?;
        one(
            &mut e,
            "pharos_fwd_backend_write_requests",
            "Write requests issued to the targets (one pwrite of an object each)",
            v.backend_write_requests,
        )?;
        if !v.enabled {
            return Ok(());
        }
        one(
            &mut e,
            "pharos_fwd_gas_gathered_writes",
            "Client writes gathered into a compute node's buffer",
            v.gathered,
        )?;
        one(
            &mut e,
            "pharos_fwd_gas_kept_writes",
            "Gathered socket writes kept in the buffer they arrived in (no copy)",
            v.kept,
        )?;
        one(&mut e, "pharos_fwd_gas_merged_writes", "Gathered writes merged with an adjacent buffered one", v.merged)?;
        one(&mut e, "pharos_fwd_gas_runs", "Contiguous runs written to the targets by flushes", v.runs)?;
        one(&mut e, "pharos_fwd_gas_bytes", "Bytes written to the targets by flushes", v.bytes)?;
        one(&mut e, "pharos_fwd_gas_deferred_errors", "Flushed runs whose write failed", v.deferred_errors)?;
        let g = ConstGauge::new(v.buffered_bytes as i64);
        g.encode(e.encode_descriptor(
            "pharos_fwd_gas_buffered_bytes",
            "Bytes gathered, not written yet",
            None,
            g.metric_type(),
        )?)?;
        let c0 = ConstCounter::new(0u64);
        let mut f =
            e.encode_descriptor("pharos_fwd_gas_flushes", "Buffer flushes, by reason", None, c0.metric_type())?;
        for r in REASONS {
            ConstCounter::new(v.flushes.get(r).copied().unwrap_or(0)).encode(f.encode_family(&[("reason", r)])?)?;
        }
        Ok(())
    }
}
