//! The admin routes of node-local mode (`backend/nodelocal.rs`): `GET /nodelocal` lists every
//! job's rank directories (target, attached compute node); `POST /nodelocal/attach`
//! `{"job": "42", "node": "cn9", "replaces": "cn3"}`: compute node `cn9` replaces the failed
//! `cn3` in job 42 (every rank attached to `cn3` is attached to `cn9`; answers the ranks).
use std::sync::Arc;

use axum::extract::rejection::JsonRejection;
use axum::extract::State;
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use super::{bad, AdminState, Resp};

type St = State<Arc<AdminState>>;

/// `GET /nodelocal`.
pub(super) async fn list(State(a): St) -> Resp {
    let b = &a.server.backend;
    let ranks: Vec<Value> = b
        .local
        .attachments()
        .into_iter()
        .map(|(job, rank, ti, node)| json!({"job": job, "rank": rank, "target": b.targets[ti as usize].name, "node": node}))
        .collect();
    Ok(Json(json!({"ranks": ranks})))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Attach {
    job: String,
    node: String,
    replaces: String,
}

/// `POST /nodelocal/attach`.
pub(super) async fn attach(State(a): St, b: Result<Json<Attach>, JsonRejection>) -> Resp {
    let Json(r) = b.map_err(|e| bad(e.body_text()))?;
    if r.node.is_empty() || r.node == r.replaces {
        return Err(bad("node must be a compute node other than the one it replaces"));
    }
    let ranks = a.server.backend.local.take_over(&r.job, &r.replaces, &r.node).map_err(|e| bad(e.to_string()))?;
    log::info!("node-local: {} replaces {} in job {}: ranks {:?}", r.node, r.replaces, r.job, ranks);
    Ok(Json(json!({"job": r.job, "node": r.node, "ranks": ranks})))
}
