"""The real Alertmanager and a webhook receiver for the system-side diagnosis tests; ``store`` (a
real migrated chDB store per module) is tests/conftest.py's; the simulator lives in
pharos_sysdiag_sim."""

from __future__ import annotations

import pytest
from pharos_testkit import running_alertmanager

AM_CONFIG = """\
route:
  receiver: pharos-null
  group_by: ['alertname']
  group_wait: 1s
  group_interval: 1s
  repeat_interval: 1h
receivers:
  - name: pharos-null
    webhook_configs:
      - url: "__RECEIVER__"
        send_resolved: true
"""


class Receiver:
    """A real loopback HTTP server recording the JSON bodies POSTed to it (Alertmanager's
    webhook notifications, Pharos's generic webhook)."""

    def __init__(self) -> None:
        import http.server
        import json
        import threading

        self.bodies: list[tuple[str, dict]] = []
        outer = self

        class H(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                n = int(self.headers.get("Content-Length", 0))
                outer.bodies.append((self.path, json.loads(self.rfile.read(n) or b"null")))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *a):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def receiver():
    r = Receiver()
    yield r
    r.close()


@pytest.fixture(scope="module")
def alertmanager(tmp_path_factory, receiver):
    """The real Alertmanager (Debian prometheus-alertmanager) on a free loopback port, no
    clustering, storage in tmp; stopped (SIGTERM, then SIGKILL) at the module's end."""
    d = tmp_path_factory.mktemp("alertmanager")
    with running_alertmanager(d, AM_CONFIG.replace("__RECEIVER__", receiver.url + "/am")) as url:
        yield url
