from __future__ import annotations

from pharos_api.app import create_app
from pharos_core.settings import Settings
from pharos_core.store import Store, StoreError


def test_health(client):
    r = client.get("/v1/health")
    assert r.status_code == 200 and r.json()["status"] == "ok" and r.json()["store"] == "ok"


def test_pipeline_counts(client):
    j = client.get("/v1/pipeline").json()
    assert j["records"] == 14 + 1 + 6 + 4 + 3 + 1
    assert j["live"] is None  # no pipeline in this process
    assert j["batches"] == 4 and j["producers"] == 2
    assert j["gaps"] == 1  # agent-1 has seqs 0, 1, 3
    assert j["dead_letters"] == 1 and j["jobs"] == 5
    assert j["dropped_records"] == j["drops"]["total"] == 11 + 27  # newest row per (producer, job)
    assert j["drops"]["unmerged_fallbacks"] == 7 + 0 + 9
    assert j["last_ingested"] is not None


def test_docs_and_openapi(client):
    assert client.get("/docs").status_code == 200
    spec = client.get("/openapi.json").json()
    ops = {op["operationId"] for path in spec["paths"].values() for op in path.values()}
    assert {"list_jobs", "get_job", "health", "pipeline_stats"} <= ops
    assert "/v1/jobs/{job_id}" in spec["paths"] and "404" in spec["paths"]["/v1/jobs/{job_id}"]["get"]["responses"]


class _BrokenStore(Store):
    backend = "broken"

    def _open_handle(self):
        return object()

    def _close_handle(self, handle):
        pass

    def _command(self, sql, params):
        raise RuntimeError("boom")

    _query = _query_columns = _command

    def _insert_json(self, table, payload):
        raise RuntimeError("boom")


def test_store_failure_is_503(tmp_path):
    from fastapi.testclient import TestClient

    c = TestClient(create_app(_BrokenStore(), Settings(state_dir=tmp_path, api_auth="none")))
    assert c.get("/v1/health").status_code == 503
    r = c.get("/v1/jobs/mix")
    assert r.status_code == 503 and r.json()["detail"] == "store error: boom"
    assert isinstance(StoreError("x"), RuntimeError)


def test_pipeline_live_counters(app, client):
    class _FakePipeline:
        def stats(self):
            return {"messages": 3, "gaps": 1, "last_commit_time": None}

    app.state.pipeline = _FakePipeline()
    try:
        assert client.get("/v1/pipeline").json()["live"] == {"messages": 3, "gaps": 1, "last_commit_time": None}
    finally:
        del app.state.pipeline
