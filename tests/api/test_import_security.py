"""Darshan import without server paths (issue 14, item 2): the API opens no path outside the
configured import directory (``../``, absolute paths, symbolic links (none is followed); checked with a Python
audit hook that records every file the process opens), refuses path imports when no directory is
configured, bounds uploads (413) and reads only regular files (/dev/zero, a FIFO: failed at once,
no hash returned); ``pharos import darshan`` uploads the log to the API with the token."""

from __future__ import annotations

import os
import shutil
import sys
import threading
import time

import pytest
from fastapi.testclient import TestClient
from pharos_synthetic_jobs import build_store
from pharos_testkit import DARSHAN_LOGS, need_darshan, served
from typer.testing import CliRunner

from pharos_api.app import create_app
from pharos_api.auth import create_token
from pharos_core.settings import Settings
from pharos_pipeline.darshan_import import import_log

LOG = "imbalanced_io/imbalanced-io.darshan"
OPENED: list[str] = []
_RECORD = threading.Event()


def _audit(event: str, args: tuple) -> None:
    if _RECORD.is_set() and event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
        OPENED.append(os.fsdecode(args[0]))


sys.addaudithook(_audit)  # cannot be removed; records only while _RECORD is set


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    s = build_store(tmp_path_factory.mktemp("imp"))
    yield s
    s.close()


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("srv")
    inside, outside = root / "imports", root / "private"
    inside.mkdir()
    outside.mkdir()
    (outside / "secret.darshan").write_bytes(b"secret bytes")
    (inside / "junk.darshan").write_bytes(b"junk")
    (inside / "big.darshan").write_bytes(b"x" * 5000)
    (inside / "sub").mkdir()
    os.symlink(outside / "secret.darshan", inside / "out.darshan")  # leads out: refused
    os.symlink("../private", inside / "escape")  # a folder symlink out: refused
    os.symlink("/dev/zero", inside / "zero")  # a device out of the folder: refused
    (inside / "sub" / "in.darshan").write_bytes(b"junk")  # a file in a sub-folder: fine
    os.symlink(inside / "junk.darshan", inside / "sub" / "link.darshan")  # stays inside, still a link: refused
    os.mkfifo(inside / "fifo.darshan")  # inside, not a regular file: failed at once
    return inside, outside


@pytest.fixture(scope="module")
def admin(store):
    return {"Authorization": f"Bearer {create_token(store, 'admin', 'root')['token']}"}


def app_with(store, tmp_path, **kw):
    return create_app(store, Settings(state_dir=tmp_path, api_auth="token", import_max_bytes=1000, **kw))


def test_no_import_dir_no_path_import(store, admin, tmp_path, dirs):
    _, outside = dirs
    with TestClient(app_with(store, tmp_path)) as c:
        r = c.post("/v1/import/darshan", json={"paths": [str(outside / "secret.darshan")]}, headers=admin)
    assert r.status_code == 403 and "no import directory" in r.json()["detail"]


def test_paths_out_of_the_import_dir_are_never_opened(store, admin, tmp_path, dirs):
    inside, outside = dirs
    secret = str(outside / "secret.darshan")
    refused = [
        secret,
        "/etc/passwd",
        "../private/secret.darshan",
        "sub/../../private/secret.darshan",
        "out.darshan",
        "escape/secret.darshan",
        "zero",
        "sub/link.darshan",
        "/dev/zero",
        ".",
        "",
    ]
    OPENED.clear()
    _RECORD.set()
    try:
        with TestClient(app_with(store, tmp_path, import_dir=inside)) as c:
            for p in refused:
                r = c.post("/v1/import/darshan", json={"paths": ["junk.darshan", p]}, headers=admin)
                assert r.status_code in (403, 422), (p, r.status_code, r.text)  # the whole request, before any read
            r = c.post("/v1/import/darshan", json={"paths": ["junk.darshan", "sub/in.darshan"]}, headers=admin)
    finally:
        _RECORD.clear()
    assert r.status_code == 200
    res = r.json()["results"]
    assert [x["path"] for x in res] == ["junk.darshan", "sub/in.darshan"]
    assert all(x["status"] == "failed" and x["log_id"] is None for x in res)  # no hash of a failed file
    assert str(inside) not in r.text  # the server's folder is not echoed
    leaked = [p for p in OPENED if os.path.realpath(p).startswith(str(outside)) or p in ("/etc/passwd", "/dev/zero")]
    assert leaked == [], leaked
    assert any(p.endswith("junk.darshan") for p in OPENED)  # the hook did see the allowed opens


def test_devices_fifos_and_oversize_files_fail_at_once(store, admin, tmp_path, dirs):
    inside, _ = dirs
    t = time.monotonic()
    for p in ("/dev/zero", inside / "fifo.darshan"):
        r = import_log(store, p)
        assert r.status == "failed" and "not a regular file" in r.error and r.log_id is None, r
    r = import_log(store, inside / "big.darshan", max_bytes=1000)
    assert r.status == "failed" and "over the import limit" in r.error and r.log_id is None
    assert time.monotonic() - t < 5
    with TestClient(app_with(store, tmp_path, import_dir=inside)) as c:
        r = c.post("/v1/import/darshan", json={"paths": ["fifo.darshan", "big.darshan"]}, headers=admin)
    assert r.status_code == 200, r.text
    assert [x["error"] for x in r.json()["results"]] == [
        "fifo.darshan: not a regular file",
        "big.darshan: 5000 bytes, over the import limit of 1000 bytes",
    ]


def test_upload_is_size_limited(store, admin, tmp_path):
    with TestClient(app_with(store, tmp_path)) as c:
        up = lambda body, **kw: c.post(  # noqa: E731
            "/v1/import/darshan/upload",
            content=body,
            headers=admin | {"Content-Type": "application/octet-stream"},
            **kw,
        )
        r = up(b"x" * 5000)  # Content-Length over the limit: refused before reading
        assert r.status_code == 413 and "1000 bytes" in r.json()["detail"]
        r = up(iter([b"x" * 600, b"x" * 600]))  # chunked, no Content-Length: stopped while streaming
        assert r.status_code == 413
        r = up(b"not a darshan log", params={"filename": "../../etc/x.darshan"})
        assert r.status_code == 200
        (res,) = r.json()["results"]
        assert res["status"] == "failed" and res["log_id"] is None and res["path"] == "x.darshan"
        assert "pharos-upload-" not in res["error"]  # the temp file's name is not shown
        assert c.post("/v1/import/darshan/upload", content=b"x").status_code == 401


def test_upload_a_real_log(store, admin, tmp_path):
    log = need_darshan(DARSHAN_LOGS / LOG)
    with TestClient(create_app(store, Settings(state_dir=tmp_path, api_auth="token"))) as c:
        h = admin | {"Content-Type": "application/octet-stream"}
        r = c.post("/v1/import/darshan/upload", content=log.read_bytes(), params={"filename": log.name}, headers=h)
        assert r.status_code == 200, r.text
        (res,) = r.json()["results"]
        assert res["status"] == "imported" and res["path"] == log.name and res["log_id"].startswith("darshan:")
        r = c.post("/v1/import/darshan/upload", content=log.read_bytes(), headers=h)
        assert r.json()["results"][0]["status"] == "skipped"


def test_cli_import_uploads_with_the_token(store, tmp_path, monkeypatch):
    """`pharos import darshan` against an API with auth: uploads the file (the server has no
    import directory, so a path import could not work), sending PHAROS_API_TOKEN."""
    from pharos_api.cli import app as cli

    log = tmp_path / "copy.darshan"
    shutil.copy(need_darshan(DARSHAN_LOGS / "empty_log/empty_log.darshan"), log)
    token = create_token(store, "admin", "root")["token"]
    with served(create_app(store, Settings(state_dir=tmp_path, api_auth="token"))) as url:
        runner = CliRunner()
        r = runner.invoke(cli, ["import", "darshan", str(log), "--api", url, "--json"], env={"PHAROS_API_TOKEN": ""})
        assert r.exit_code == 1 and "401" in r.output
        r = runner.invoke(cli, ["import", "darshan", str(log), "--api", url], env={"PHAROS_API_TOKEN": token})
        assert r.exit_code == 0 and "imported" in r.output and "copy.darshan" in r.output, r.output
        # tokens through the API: create, list, revoke
        r = runner.invoke(
            cli, ["token", "create", "--role", "user", "--user", "dave", "--api", url], env={"PHAROS_API_TOKEN": token}
        )
        assert r.exit_code == 0 and r.stdout.startswith("pht_"), r.output
        tid = r.stdout.split("_")[1]
        r = runner.invoke(cli, ["token", "list", "--api", url], env={"PHAROS_API_TOKEN": token, "COLUMNS": "160"})
        assert r.exit_code == 0 and tid in r.output and "dave" in r.output
        r = runner.invoke(cli, ["token", "revoke", tid, "--api", url], env={"PHAROS_API_TOKEN": token})
        assert r.exit_code == 0 and "revoked" in r.output
        r = runner.invoke(cli, ["token", "list", "--api", url], env={"PHAROS_API_TOKEN": "pht_bad"})
        assert r.exit_code == 1 and "401" in r.output
