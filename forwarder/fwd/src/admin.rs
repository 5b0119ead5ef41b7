//! Admin HTTP interface of the daemon (loopback, JSON). Changes apply live and atomically:
//! placement is swapped as a whole (arc-swap), target limits and faults are single atomic
//! stores in the targets' shared state (so they apply to every daemon serving the target).
//! Requests already executing finish under the settings they started with.
//!
//! Every route but `GET /status` needs the admin token (`--admin-token-file`) as
//! `Authorization: Bearer <token>`: 401 without it or with another, 403 for all of them when no
//! token is configured ([`pharos_fwd_proto::auth::admin_refusal`]).
//!
//! * `GET /status`: counters, record and metrics shipping stats.
//! * `GET /targets`: every target's limit, faults, open count, throttle waits.
//! * `PUT /targets/{name}`: `{"max_perf_mb_s": 50, "added_latency_ms": 5, "slowdown": 3}`
//!   (each optional; `max_perf_mb_s: 0` removes the limit, `slowdown: 1` the slowdown).
//! * `GET /placement`, `PUT /placement`: the whole placement document
//!   (`{"pools": {"fast": {"targets": ["ost0"], "max_perf": {"ost0": 50}}},
//!   "default_pool": "fast", "job_pools": {"42": "fast"}, "stripe_size": 1048576}`; schema:
//!   `proto/placement/placement.schema.json`). An unknown field is a 400 naming it.
//! * `GET /migrations`: the online migration tasks (`backend/migrate.rs`): per task its id,
//!   path, `source_target`, `dest_target`, `state` (`queued`, `copying`, `switched`, `done`,
//!   `failed`, `cancelled`, `deferred`), `pinned`, `priority`, `min_mb_s`, `max_mb_s`,
//!   `unit_bytes`, `rate_mb_s` (MODM's allocation now), `bytes_done`, `bytes_left`,
//!   `recopies`, `deferrals`, `error`, `copy_s`, `achieved_mb_s`; the engine's `settings` and
//!   `minimums_scaled` (the copying tasks' minimums exceeded the cap and were scaled down).
//! * `POST /migrations`: `{"source_target": "ost3", "paths": ["/a/f"], "min_mb_s": 50,
//!   "max_mb_s": 200, "priority": 1, "unit_bytes": 1048576, "pool": "fast"}` (all but
//!   `source_target` optional): one task per file with objects on the target (the given paths,
//!   else the whole namespace), most recently modified first; answers `{"ids": [..]}`. 400:
//!   unknown target or pool, a given path that is not a file, figures out of range.
//! * `PUT /migrations`: the engine's settings `{"max_total_mb_s": 200, "max_active": 4,
//!   "retry_s": 2}` (all three).
//! * `PUT /migrations/{id}`: `{"pinned": true, "priority": 3, "min_mb_s": 20, "max_mb_s": 80}`
//!   (each optional; pinned: the file stays where it is, a copy under way is rolled back, the
//!   task waits queued until unpinned). `DELETE /migrations/{id}`: cancels (a copy under way
//!   is rolled back). 404: no such task. All migration routes answer 503 when the daemon runs
//!   without migration (`--migration false`).
//! * `GET /nodelocal`: node-local rank directories (`backend/nodelocal.rs`): `{"ranks": [{"job",
//!   "rank", "target", "node"}]}`; `POST /nodelocal/attach` `{"job": "42", "node": "cn9",
//!   "replaces": "cn3"}`: `cn9` replaces the failed `cn3` in the job (its ranks only), answers
//!   `{"ranks": [..]}`.
//! * `GET /metrics`: Prometheus (OpenMetrics text, the `prometheus-client` crate): the counters of
//!   `/status` read at each scrape, the targets' queue wait and the service-time histograms, the
//!   request classes' queuing delay and worker allocation ([`crate::raas`]).
use std::fmt;
use std::sync::Arc;

use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::get;
use axum::{Json, Router};
use pharos_fwd_proto::auth::{admin_guard, AdminToken};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::backend::Placement;
use crate::metrics::ShipStats;
use crate::server::Server;

/// The Content-Type of `GET /metrics`.
pub const METRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

pub struct AdminState {
    pub server: Arc<Server>,
    pub metrics_stats: Box<dyn Fn() -> ShipStats + Send + Sync>,
    /// The admin credential (`None`: only `GET /status` is served).
    pub token: Option<AdminToken>,
    /// The online migration engine, when enabled.
    pub migrations: Option<Arc<crate::backend::migrate::Migrations>>,
}

type St = State<Arc<AdminState>>;
type Resp = Result<Json<Value>, (StatusCode, Json<Value>)>;

fn bad(msg: impl Into<String>) -> (StatusCode, Json<Value>) {
    (StatusCode::BAD_REQUEST, Json(json!({"error": msg.into()})))
}

#[derive(Serialize)]
struct TargetView {
    name: String,
    dir: String,
    max_perf_mb_s: f64,
    added_latency_ns: u64,
    slowdown: f64,
    open_count: i64,
    throttle_waits: u64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TargetSet {
    max_perf_mb_s: Option<f64>,
    added_latency_ms: Option<f64>,
    added_latency_ns: Option<u64>,
    slowdown: Option<f64>,
}

fn targets(s: &Server) -> Vec<TargetView> {
    s.backend
        .targets
        .iter()
        .map(|t| TargetView {
            name: t.name.clone(),
            dir: t.dir.display().to_string(),
            max_perf_mb_s: t.shm.max_perf(),
            added_latency_ns: t.shm.added_latency_ns(),
            slowdown: t.shm.slowdown(),
            open_count: t.shm.open_count(),
            throttle_waits: t.shm.throttle_waits(),
        })
        .collect()
}

async fn status(State(a): St) -> Json<Value> {
    let s = &a.server;
    Json(json!({
        "node": s.cfg.node_name,
        "workers": s.cfg.workers,
        "weights": s.cfg.weights,
        "threads": s.sched.status(),
        "counters": s.counters_view(),
        "records": s.sink.stats(),
        "target_metrics": (a.metrics_stats)(),
        "cache": s.backend.cache.get().map(|c| c.view()),
        "gas": s.backend.gas_view(),
    }))
}

async fn get_targets(State(a): St) -> Json<Value> {
    Json(json!(targets(&a.server)))
}

async fn put_target(State(a): St, Path(name): Path<String>, Json(b): Json<TargetSet>) -> Resp {
    let s = &a.server;
    let i = s.backend.target_index(&name).ok_or_else(|| bad(format!("unknown target {name}")))?;
    let t = &s.backend.targets[i as usize];
    if b.max_perf_mb_s.is_some_and(|v| !(v.is_finite() && v >= 0.0)) {
        return Err(bad("max_perf_mb_s must be >= 0"));
    }
    if b.slowdown.is_some_and(|v| !(v.is_finite() && v >= 1.0)) {
        return Err(bad("slowdown must be >= 1"));
    }
    if b.added_latency_ms.is_some_and(|v| !(v.is_finite() && v >= 0.0)) {
        return Err(bad("added_latency_ms must be >= 0"));
    }
    if let Some(v) = b.max_perf_mb_s {
        t.shm.set_max_perf(v);
    }
    if let Some(v) = b.added_latency_ms {
        t.shm.set_added_latency_ns((v * 1e6) as u64);
    }
    if let Some(v) = b.added_latency_ns {
        t.shm.set_added_latency_ns(v);
    }
    if let Some(v) = b.slowdown {
        t.shm.set_slowdown(v);
    }
    Ok(Json(json!(targets(s).into_iter().nth(i as usize))))
}

async fn get_placement(State(a): St) -> Json<Value> {
    Json(json!(*a.server.backend.placement.load_full()))
}

/// `PUT /placement`: a document that does not parse as a [`Placement`] (a misspelled or unknown
/// field, a wrong type; `proto/placement/placement.schema.json`) is a 400 with serde's message,
/// like one that names an unknown target or pool.
async fn put_placement(State(a): St, body: Result<Json<Placement>, JsonRejection>) -> Resp {
    let Json(p) = body.map_err(|r| match r {
        JsonRejection::JsonDataError(e) => bad(e.body_text()),
        r => (r.status(), Json(json!({"error": r.body_text()}))),
    })?;
    a.server.backend.validate_placement(&p).map_err(bad)?;
    a.server.backend.placement.store(Arc::new(p.clone()));
    Ok(Json(json!(p)))
}

/// One metric family of `values` (label value, metric), under the label `label`.
fn family<M: EncodeMetric>(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    label: &str,
    values: &[(&str, M)],
) -> fmt::Result {
    let Some((_, first)) = values.first() else { return Ok(()) };
    let mut f = e.encode_descriptor(name, help, None, first.metric_type())?;
    for (v, m) in values {
        m.encode(f.encode_family(&[(label, *v)])?)?;
    }
    Ok(())
}

/// One metric without labels.
fn single<M: EncodeMetric>(e: &mut DescriptorEncoder, name: &str, help: &str, m: M) -> fmt::Result {
    m.encode(e.encode_descriptor(name, help, None, m.metric_type())?)
}

/// The daemon's counters (`/status`) as metric families, read at each scrape.
struct FwdCollector(Arc<AdminState>);

impl fmt::Debug for FwdCollector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FwdCollector").field("node", &self.0.server.cfg.node_name).finish()
    }
}

impl Collector for FwdCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> fmt::Result {
        let s = &self.0.server;
        let c = s.counters_view();
        let r = s.sink.stats();
        let m = (self.0.metrics_stats)();
        let e = &mut enc;
        let n = ConstCounter::new;
        family(
            e,
            "pharos_fwd_requests",
            "Requests served (answered), by class",
            "class",
            &[("metadata", n(c.served_metadata)), ("small", n(c.served_small)), ("large", n(c.served_large))],
        )?;
        single(e, "pharos_fwd_request_errors", "Requests answered with an error", n(c.errors))?;
        single(
            e,
            "pharos_fwd_replies_not_sent",
            "Replies that could not be sent (connection closed, client replays)",
            n(c.reply_failures),
        )?;
        single(
            e,
            "pharos_fwd_oversized_replies",
            "Replies too large for a frame, answered EMSGSIZE",
            n(c.oversized_replies),
        )?;
        single(e, "pharos_fwd_worker_panics", "Requests whose execution panicked (answered EIO)", n(c.worker_panics))?;
        single(
            e,
            "pharos_fwd_served_inline",
            "Requests served by their connection's decoder in a sleeping worker's place (--serve-inline)",
            n(c.served_inline),
        )?;
        single(e, "pharos_fwd_bad_frames", "Frames that did not decode", n(c.bad_frames))?;
        single(e, "pharos_fwd_rejected_connections", "Connections refused over max_conns", n(c.rejected_conns))?;
        single(e, "pharos_fwd_connections_accepted", "Connections accepted", n(c.conns_total))?;
        single(e, "pharos_fwd_open_connections", "Connections open now", ConstGauge::new(c.open_conns as i64))?;
        family(
            e,
            "pharos_fwd_bytes",
            "Bytes read and written for clients",
            "direction",
            &[("read", n(c.bytes_read)), ("write", n(c.bytes_written))],
        )?;
        let q = |i: usize| ConstGauge::new(c.queued[i] as i64);
        family(
            e,
            "pharos_fwd_queued_requests",
            "Requests waiting in a class queue now",
            "class",
            &[("metadata", q(0)), ("small", q(1)), ("large", q(2))],
        )?;
        single(
            e,
            "pharos_fwd_buffer_pool_misses",
            "Data buffers allocated because the pool was empty",
            n(c.buffer_pool_misses),
        )?;
        family(
            e,
            "pharos_fwd_shm",
            "Shared-memory data path: connections attached, attaches refused, data requests served through a region",
            "what",
            &[("attaches", n(c.shm_attaches)), ("refusals", n(c.shm_refusals)), ("requests", n(c.shm_requests))],
        )?;
        single(
            e,
            "pharos_fwd_watching_mounts",
            "Mounts keeping a watch connection (pushed invalidations)",
            ConstGauge::new(c.watching_mounts as i64),
        )?;
        family(
            e,
            "pharos_fwd_invalidations",
            "Changes pushed to watching mounts, and dropped (queue full: the mounts' TTL bounds them)",
            "outcome",
            &[("pushed", n(c.invalidations_pushed)), ("dropped", n(c.invalidations_dropped))],
        )?;
        single(e, "pharos_fwd_records_produced", "Per-request records made (one per served request)", n(r.produced))?;
        single(e, "pharos_fwd_records_sent", "Records Kafka acknowledged", n(r.records_sent))?;
        family(
            e,
            "pharos_fwd_records_dropped",
            "Records not stored: sink queue full, batch refused by Kafka, Kafka disabled",
            "reason",
            &[
                ("overflow", n(r.overflow_drops)),
                ("delivery_failure", n(r.delivery_failures)),
                ("not_shipped", n(r.not_shipped)),
            ],
        )?;
        family(
            e,
            "pharos_fwd_target_metrics_batches",
            "Target metrics batches by outcome",
            "outcome",
            &[
                ("sent", n(m.batches_sent)),
                ("delivery_failure", n(m.delivery_failures)),
                ("not_shipped", n(m.not_shipped)),
            ],
        )?;
        let waits = s.stats.queue_waits();
        let names: Vec<&str> = s.backend.targets.iter().map(|t| t.name.as_str()).collect();
        let per_target = |f: &dyn Fn(&crate::metrics::QueueWait) -> f64| -> Vec<(&str, ConstCounter<f64>)> {
            names.iter().zip(&waits).map(|(t, w)| (*t, ConstCounter::new(f(w)))).collect()
        };
        family(
            e,
            "pharos_fwd_queue_wait_seconds",
            "Time data requests waited in a target's queue, summed (Little's law: the queue depth integrated over time)",
            "target",
            &per_target(&|w| w.wait_s),
        )?;
        family(
            e,
            "pharos_fwd_dequeued_requests",
            "Data requests that left a target's queue for a worker",
            "target",
            &per_target(&|w| w.dequeued as f64),
        )?;
        let depth: Vec<(&str, ConstGauge)> =
            names.iter().zip(&waits).map(|(t, w)| (*t, ConstGauge::new(w.depth))).collect();
        family(e, "pharos_fwd_target_queue_depth", "Data requests queued for a target now", "target", &depth)?;
        s.sched.encode_metrics(e)?;
        Ok(())
    }
}

/// The registry of `GET /metrics`: the counters, the service-time histograms, the build.
fn registry(state: &Arc<AdminState>) -> Registry {
    let mut reg = Registry::default();
    reg.register_collector(Box::new(FwdCollector(state.clone())));
    reg.register_collector(Box::new(crate::backend::cache::CacheCollector(state.server.backend.clone())));
    reg.register_collector(Box::new(crate::backend::gas::GasCollector(state.server.backend.clone())));
    reg.register(
        "pharos_fwd_service_seconds",
        "Service time of requests with a target (execution and reply), by op kind",
        state.server.stats.service.clone(),
    );
    let node = state.server.cfg.node_name.clone();
    let build = Info::new(vec![
        ("service", "fwd".to_string()),
        ("version", env!("CARGO_PKG_VERSION").to_string()),
        ("node", node),
    ]);
    reg.register("pharos_build", "The running Pharos component and its version", build);
    reg
}

/// A registry in the OpenMetrics text format.
pub fn render(reg: &Registry) -> String {
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, reg).expect("writing to a String");
    out
}

/// The admin token check in front of every route.
async fn guard(State(a): St, req: Request, next: Next) -> Response {
    admin_guard(a.token.as_ref(), req, next).await
}

pub fn router(state: Arc<AdminState>) -> Router {
    let reg = Arc::new(registry(&state));
    let metrics = move || {
        let reg = reg.clone();
        async move { ([(header::CONTENT_TYPE, METRICS_CONTENT_TYPE)], render(&reg)) }
    };
    Router::new()
        .route("/status", get(status))
        .route("/targets", get(get_targets))
        .route("/targets/{name}", get(get_targets).put(put_target))
        .route("/placement", get(get_placement).put(put_placement))
        .route("/metrics", get(metrics))
        .route("/migrations", get(migrations::list).post(migrations::submit).put(migrations::settings))
        .route("/migrations/{id}", axum::routing::put(migrations::change).delete(migrations::cancel))
        .route("/nodelocal", get(nodelocal::list))
        .route("/nodelocal/attach", axum::routing::post(nodelocal::attach))
        .layer(middleware::from_fn_with_state(state.clone(), guard))
        .with_state(state)
}

/// Serves the admin interface on `listener` in a background thread.
pub fn spawn(listener: std::net::TcpListener, state: Arc<AdminState>) {
    std::thread::Builder::new()
        .name("fwd-admin".into())
        .spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("tokio runtime");
            rt.block_on(async move {
                listener.set_nonblocking(true).expect("nonblocking");
                let l = tokio::net::TcpListener::from_std(listener).expect("admin listener");
                if let Err(e) = axum::serve(l, router(state)).await {
                    log::error!("admin server: {e}");
                }
            })
        })
        .expect("spawn admin thread");
}

mod migrations;
mod nodelocal;

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};

    use super::*;

    /// `(status, body)` of an HTTP/1.1 request to `addr` with the admin token.
    fn request(addr: std::net::SocketAddr, method: &str, path: &str, body: &str) -> (u16, String) {
        let mut c = std::net::TcpStream::connect(addr).unwrap();
        write!(
            c,
            "{method} {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer tok\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut out = String::new();
        c.read_to_string(&mut out).unwrap();
        let status = out.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
        (status, out.split("\r\n\r\n").nth(1).unwrap_or_default().to_string())
    }

    /// A misspelled field of the placement document is a 400 naming it, and the placement
    /// in force stays; a good document still applies.
    #[test]
    fn put_placement_refuses_unknown_fields_with_a_400() {
        let (_d, server) = crate::server::tests::server(&[7; 32]);
        let state = Arc::new(AdminState {
            server: server.clone(),
            metrics_stats: Box::new(|| ShipStats {
                batches_produced: 0,
                batches_sent: 0,
                delivery_failures: 0,
                not_shipped: 0,
            }),
            token: Some(AdminToken::new(b"tok")),
            migrations: None,
        });
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        spawn(l, state);
        let (status, body) =
            request(addr, "PUT", "/placement", r#"{"pools": {"p": {"targets": ["ost0"]}}, "defualt_pool": "p"}"#);
        assert_eq!(status, 400, "{body}");
        assert!(body.contains("unknown field `defualt_pool`"), "{body}");
        let (status, body) = request(addr, "PUT", "/placement", r#"{"pools": {"p": {"targetz": ["ost0"]}}}"#);
        assert_eq!(status, 400, "{body}");
        assert!(body.contains("unknown field `targetz`"), "{body}");
        assert_eq!(*server.backend.placement.load_full(), Placement::default(), "nothing applied");
        let (status, body) =
            request(addr, "PUT", "/placement", r#"{"pools": {"p": {"targets": ["ost1"]}}, "default_pool": "p"}"#);
        assert_eq!(status, 200, "{body}");
        assert_eq!(server.backend.placement.load().default_pool.as_deref(), Some("p"));
        // Not JSON at all: still a 400.
        assert_eq!(request(addr, "PUT", "/placement", "{").0, 400);
    }
}
