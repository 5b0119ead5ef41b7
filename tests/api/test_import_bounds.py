"""Darshan import safe on a shared server (issue 26, items 8 and 9).

* Item 8: PyDarshan parses in a child process with CPU-time, memory and wall-time limits
  (:mod:`pharos_pipeline.darshan_parse`): a log over a limit is a ``failed`` result naming the
  limit, within about the limit, and the server answers the next request.
* Item 9: a path import opens each log once, beneath the import directory, following no
  symbolic link (:func:`pharos_pipeline.darshan_log.open_beneath`): a folder of the path swapped
  for a link leading out between the request's checks and the read changes nothing (the import
  reads the file that was opened), and a link anywhere on the path is refused (403).
"""

from __future__ import annotations

import os
import shutil
import time

import pytest
from fastapi.testclient import TestClient
from pharos_synthetic_jobs import build_store
from pharos_testkit import DARSHAN_LOGS, need_darshan

from pharos_api.app import create_app
from pharos_api.auth import create_token
from pharos_api.routers import diagnosis
from pharos_core.settings import Settings
from pharos_pipeline.darshan_import import import_log
from pharos_pipeline.darshan_log import DarshanImportError, open_beneath
from pharos_pipeline.darshan_parse import ParseLimits, read_log_bounded

BIG = "partial_data_dxt/partial_data_dxt.darshan"  # 65,536 DXT segments: ~0.1 s of CPU to parse
INSIDE_LOG = "imbalanced_io/imbalanced-io.darshan"
OUTSIDE_LOG = "hdf5_diagonal_write_only/hdf5_file_opens_only.darshan"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    s = build_store(tmp_path_factory.mktemp("bounds"))
    yield s
    s.close()


@pytest.fixture(scope="module")
def admin(store):
    return {"Authorization": f"Bearer {create_token(store, 'admin', 'root')['token']}"}


def _parse(rel: str, limits: ParseLimits):
    fd = os.open(need_darshan(DARSHAN_LOGS / rel), os.O_RDONLY)
    try:
        return read_log_bounded(fd, rel, limits)
    finally:
        os.close(fd)


def test_parse_within_limits_is_the_in_process_parse():
    from pharos_pipeline.darshan_log import read_log

    bounded = _parse(BIG, ParseLimits())
    direct = read_log(need_darshan(DARSHAN_LOGS / BIG))
    assert bounded == direct and len(bounded.segments) == 65536


def test_parse_over_cpu_limit_fails_naming_it():
    t = time.monotonic()
    with pytest.raises(DarshanImportError, match=r"more than 0\.02 s of CPU"):
        _parse(BIG, ParseLimits(cpu_s=0.02))
    assert time.monotonic() - t < 10


def test_parse_over_memory_limit_fails_naming_it():
    with pytest.raises(DarshanImportError, match=r"more than 64 MiB of memory|crashed .*memory limit 64 MiB"):
        _parse(BIG, ParseLimits(memory_bytes=64 * 2**20))


def test_parse_over_wall_limit_fails_naming_it():
    with pytest.raises(DarshanImportError, match=r"longer than 0\.001 s"):
        _parse(BIG, ParseLimits(wall_s=0.001))


def test_upload_over_cpu_limit_is_a_failed_result_and_the_server_goes_on(store, admin, tmp_path):
    body = need_darshan(DARSHAN_LOGS / BIG).read_bytes()
    settings = Settings(state_dir=tmp_path, api_auth="token", import_parse_cpu_s=0.02)
    with TestClient(create_app(store, settings)) as c:
        t = time.monotonic()
        r = c.post(
            "/v1/import/darshan/upload",
            params={"filename": "big.darshan"},
            content=body,
            headers=admin | {"Content-Type": "application/octet-stream"},
        )
        took = time.monotonic() - t
        assert r.status_code == 200, r.text
        (res,) = r.json()["results"]
        assert res["status"] == "failed" and "of CPU" in res["error"] and res["log_id"] is None, res
        assert took < 15
        assert c.get("/v1/health").status_code == 200
    assert import_log(store, DARSHAN_LOGS / INSIDE_LOG).status in ("imported", "skipped")  # default limits: fine


@pytest.fixture
def import_dir(tmp_path):
    inside, outside = tmp_path / "imports", tmp_path / "private"
    (inside / "sub").mkdir(parents=True)
    outside.mkdir()
    shutil.copy(need_darshan(DARSHAN_LOGS / INSIDE_LOG), inside / "sub" / "log.darshan")
    shutil.copy(need_darshan(DARSHAN_LOGS / OUTSIDE_LOG), outside / "log.darshan")
    return inside, outside


def test_a_folder_swapped_for_a_link_after_the_checks_is_not_followed(store, admin, tmp_path, import_dir, monkeypatch):
    """The race of item 9, made deterministic: right after the server has checked (and, now,
    opened) ``sub/log.darshan``, ``sub`` is replaced by a link to a private folder holding another
    log. The import must be the log that was inside, never the private one."""
    inside, outside = import_dir
    opened = diagnosis.open_import

    def open_then_swap(*args, **kw):
        fd = opened(*args, **kw)
        os.rename(inside / "sub", inside / "sub.old")
        os.symlink(outside, inside / "sub")
        return fd

    monkeypatch.setattr(diagnosis, "open_import", open_then_swap)
    settings = Settings(state_dir=tmp_path, api_auth="token", import_dir=inside)
    with TestClient(create_app(store, settings)) as c:
        r = c.post("/v1/import/darshan", json={"paths": ["sub/log.darshan"], "job_id": "race-1"}, headers=admin)
    assert r.status_code == 200, r.text
    (res,) = r.json()["results"]
    assert res["status"] in ("imported", "skipped"), res
    inside_log = import_log(store, inside / "sub.old" / "log.darshan")  # the same bytes: already imported
    assert inside_log.status == "skipped" and inside_log.log_id == res["log_id"], (inside_log, res)


def test_links_anywhere_on_the_path_are_refused(store, admin, tmp_path, import_dir):
    inside, outside = import_dir
    os.symlink(inside / "sub" / "log.darshan", inside / "in.darshan")  # a link that stays inside
    os.symlink(inside / "sub", inside / "alias")  # a folder link that stays inside
    os.symlink(outside, inside / "out")
    settings = Settings(state_dir=tmp_path, api_auth="token", import_dir=inside)
    with TestClient(create_app(store, settings)) as c:
        for p in ("in.darshan", "alias/log.darshan", "out/log.darshan"):
            r = c.post("/v1/import/darshan", json={"paths": [p]}, headers=admin)
            assert r.status_code == 403 and "symbolic link" in r.json()["detail"], (p, r.text)
        r = c.post("/v1/import/darshan", json={"paths": ["missing.darshan"]}, headers=admin)
        assert r.status_code == 200 and r.json()["results"][0]["status"] == "failed"
    for bad in ("", "/etc/passwd", "../private/log.darshan", "sub/\0x"):
        with pytest.raises(ValueError):
            open_beneath(inside, bad)
