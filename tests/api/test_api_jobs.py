from __future__ import annotations

from pharos_synthetic_jobs import MiB

from pharos_analytics.summary import job_summary
from pharos_api.schemas.jobs import JobSummaryOut

REQUIRED = {
    "job_id",
    "pattern",
    "ranks",
    "io_ranks",
    "files",
    "n_files",
    "bytes_read",
    "bytes_written",
    "ops",
    "size_histogram",
    "dropped_records",
    "first_io",
    "last_io",
    "bandwidth_mib_s",
}


def test_get_job(client, store):
    r = client.get("/v1/jobs/mix")
    assert r.status_code == 200
    j = r.json()
    assert set(j) >= REQUIRED
    assert j["job_id"] == "mix" and j["pattern"] == "1-1" and j["fan_in_pattern"] == "N-N" and j["state"] == "finished"
    assert (j["ranks"], j["io_ranks"], j["n_files"]) == (4, 2, 2)
    assert j["bytes_written"] == 4 * MiB + 299
    assert j["files"][0] == {
        "path": "/scratch/a.0",
        "bytes_read": 3 * 1023 + 4 * MiB,
        "bytes_written": 4 * MiB,
        "reads": 5,
        "writes": 4,
        "ranks": 1,
    }
    assert j["ops"]["write"] == 5 and j["non_file_ops"] == {
        "requests": 6,
        "bytes": 70,
        "by_type": {"char_device": 1, "pipe": 5},
    }
    assert j["size_histogram"]["write"]["1M-4M"] == 4 and j["size_histogram"]["read"]["4M-10M"] == 1
    assert j["dropped_records"] == 11 and j["drops"]["producers"] == 2
    assert j["first_io"].endswith("Z") or j["first_io"].endswith("+00:00")
    assert j == JobSummaryOut.model_validate(job_summary(store, "mix")).model_dump(mode="json")


def test_get_job_layer_and_files_limit(client):
    j = client.get("/v1/jobs/mix", params={"layer": "forwarder"}).json()
    assert j["layer"] == "forwarder" and j["bytes_written"] == 10 * MiB
    j = client.get("/v1/jobs/one", params={"files_limit": 1}).json()
    assert len(j["files"]) == 1 and j["n_files"] == 3
    assert client.get("/v1/jobs/mix", params={"layer": "bogus"}).status_code == 422


def test_unknown_job_is_404(client):
    r = client.get("/v1/jobs/nope")
    assert r.status_code == 404
    assert "nope" in r.json()["detail"] and "not found" in r.json()["detail"]


def test_list_jobs(client):
    r = client.get("/v1/jobs")
    assert r.status_code == 200
    j = r.json()
    assert (j["total"], j["limit"], j["offset"]) == (5, 50, 0)
    assert [i["job_id"] for i in j["items"]] == ["one", "nm", "failed", "n1", "mix"]
    assert j["items"][-1]["pattern"] == "1-1" and j["items"][-1]["bytes_written"] == 4 * MiB + 299
    page = client.get("/v1/jobs", params={"limit": 2, "offset": 1}).json()
    assert [i["job_id"] for i in page["items"]] == ["nm", "failed"] and page["total"] == 5
    assert client.get("/v1/jobs", params={"limit": 0}).status_code == 422
    assert client.get("/v1/jobs", params={"offset": -1}).status_code == 422
