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
//!   "default_pool": "fast", "job_pools": {"42": "fast"}, "stripe_size": 1048576}`).
use std::sync::Arc;

use axum::extract::{Path, Request, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::get;
use axum::{Json, Router};
use pharos_fwd_proto::auth::{admin_guard, AdminToken};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::backend::Placement;
use crate::metrics::ShipStats;
use crate::server::Server;

pub struct AdminState {
    pub server: Arc<Server>,
    pub metrics_stats: Box<dyn Fn() -> ShipStats + Send + Sync>,
    /// The admin credential (`None`: only `GET /status` is served).
    pub token: Option<AdminToken>,
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
        "counters": s.counters_view(),
        "records": s.sink.stats(),
        "target_metrics": (a.metrics_stats)(),
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

async fn put_placement(State(a): St, Json(p): Json<Placement>) -> Resp {
    a.server.backend.validate_placement(&p).map_err(bad)?;
    a.server.backend.placement.store(Arc::new(p.clone()));
    Ok(Json(json!(p)))
}

/// The admin token check in front of every route.
async fn guard(State(a): St, req: Request, next: Next) -> Response {
    admin_guard(a.token.as_ref(), req, next).await
}

pub fn router(state: Arc<AdminState>) -> Router {
    Router::new()
        .route("/status", get(status))
        .route("/targets", get(get_targets))
        .route("/targets/{name}", get(get_targets).put(put_target))
        .route("/placement", get(get_placement).put(put_placement))
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
