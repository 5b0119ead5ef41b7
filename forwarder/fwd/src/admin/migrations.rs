//! The admin routes of online migration (`backend/migrate.rs`); see the module doc of
//! `admin.rs` for the requests and answers.
use std::sync::Arc;

use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use serde_json::{json, Value};

use super::{bad, AdminState, Resp};
use crate::backend::migrate::{Change, Migrations, Request, Settings};

type St = State<Arc<AdminState>>;

fn engine(a: &AdminState) -> Result<Arc<Migrations>, (StatusCode, Json<Value>)> {
    a.migrations.clone().ok_or_else(|| {
        (StatusCode::SERVICE_UNAVAILABLE, Json(json!({"error": "migration is not enabled on this daemon"})))
    })
}

fn body<T>(b: Result<Json<T>, JsonRejection>) -> Result<T, (StatusCode, Json<Value>)> {
    b.map(|Json(t)| t).map_err(|r| match r {
        JsonRejection::JsonDataError(e) => bad(e.body_text()),
        r => (r.status(), Json(json!({"error": r.body_text()}))),
    })
}

fn not_found(id: u64) -> (StatusCode, Json<Value>) {
    (StatusCode::NOT_FOUND, Json(json!({"error": format!("no migration {id}")})))
}

/// `GET /migrations`.
pub(super) async fn list(State(a): St) -> Resp {
    let (tasks, settings, scaled) = engine(&a)?.list();
    Ok(Json(json!({"settings": settings, "minimums_scaled": scaled, "tasks": tasks})))
}

/// `POST /migrations`: plans tasks (the namespace walk runs off the admin thread).
pub(super) async fn submit(State(a): St, b: Result<Json<Request>, JsonRejection>) -> Resp {
    let (m, r) = (engine(&a)?, body(b)?);
    let ids = tokio::task::spawn_blocking(move || m.submit(&r))
        .await
        .map_err(|e| (StatusCode::INTERNAL_SERVER_ERROR, Json(json!({"error": e.to_string()}))))?
        .map_err(bad)?;
    Ok(Json(json!({"ids": ids})))
}

/// `PUT /migrations`: the engine's settings.
pub(super) async fn settings(State(a): St, b: Result<Json<Settings>, JsonRejection>) -> Resp {
    let (m, s) = (engine(&a)?, body(b)?);
    m.set_settings(s.clone()).map_err(bad)?;
    Ok(Json(json!(s)))
}

/// `PUT /migrations/{id}`.
pub(super) async fn change(State(a): St, Path(id): Path<u64>, b: Result<Json<Change>, JsonRejection>) -> Resp {
    let (m, c) = (engine(&a)?, body(b)?);
    let v = m.change(id, &c).ok_or_else(|| not_found(id))?.map_err(bad)?;
    Ok(Json(json!(v)))
}

/// `DELETE /migrations/{id}`.
pub(super) async fn cancel(State(a): St, Path(id): Path<u64>) -> Resp {
    let s = engine(&a)?.cancel(id).ok_or_else(|| not_found(id))?;
    Ok(Json(json!({"id": id, "state": s})))
}
