"""Issue 26, item 10: no test-only hooks in release binaries.

The fault hook ``PHAROS_FWD_FAULT_PANIC_PATH`` (a lookup of that path panics in the worker) is
compiled only with the cargo feature ``test-hooks`` (the ``pharos-fwd-hooks`` binary the tests
build, forwarder_testkit.build_binaries). The release ``pharos-fwd`` neither holds the name nor
acts on the variable; the hooks binary does (test_posix_namespace.py uses it)."""

from __future__ import annotations

import errno
import os

from forwarder_testkit import BIN, HOOKS_FWD, Cluster

HOOK = b"PHAROS_FWD_FAULT_PANIC_PATH"


def test_the_release_daemon_has_no_fault_hook(binaries, tmp_path, monkeypatch):
    release, hooks = ((BIN / b).read_bytes() for b in ("pharos-fwd", HOOKS_FWD))
    assert release.find(HOOK) < 0, "the release daemon holds the test hook's name"
    assert hooks.find(HOOK) >= 0, "the test build lost its hook"
    monkeypatch.setenv("PHAROS_FWD_FAULT_PANIC_PATH", "boom")
    c = Cluster(tmp_path, n_targets=1)
    try:
        d = c.start_daemon("fwd0", "--workers", "2")
        m = c.start_mount([d])
        for _ in range(3):
            try:
                os.stat(m.path / "boom")
                raise AssertionError("boom exists")
            except OSError as e:
                assert e.errno == errno.ENOENT, e  # an ordinary lookup, not an injected EIO
        (m.path / "boom").write_bytes(b"fine")
        assert (m.path / "boom").read_bytes() == b"fine"
        st = d.status()["counters"]
        assert st["worker_panics"] == 0, st
        assert "panicked" not in d.log.read_text()
    finally:
        c.close()
