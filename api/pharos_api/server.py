"""``pharos serve``: the pipeline, analytics and API in one process on one store.

chDB allows one process per data directory, so the embedded stack runs the Kafka
consumer (a thread) and the FastAPI app (uvicorn) side by side on one Store. The API listens
on its TCP port (``api_host:api_port``, tokens) and its Unix socket (``api_socket``, peers known
by uid: :mod:`pharos_api.unix_socket`). With a ClickHouse server (``PHAROS_CLICKHOUSE_URL``)
the same process works unchanged.
"""

from __future__ import annotations

import logging
import signal
import threading

from pharos_analytics.alerts import DetectionLoop
from pharos_analytics.control.loop import ControlLoop
from pharos_core.process import freeze_startup_objects
from pharos_core.settings import Settings
from pharos_core.store import migrate, open_store
from pharos_pipeline.broker_health import BrokerProbe
from pharos_pipeline.ingest import Pipeline

from .app import create_app
from .unix_socket import api_server

log = logging.getLogger("pharos.serve")


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(0)


def serve(settings: Settings) -> None:
    """Run until SIGTERM/SIGINT: migrate the store, consume Kafka, serve the API. Raises
    UnixSocketError when the API's Unix socket cannot be made (the store is closed again)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if threading.current_thread() is threading.main_thread():
        # uvicorn re-raises the SIGTERM it stopped on once it has shut down: as SystemExit, so the
        # clean-up below runs (the socket file removed, the store closed) instead of a default death
        signal.signal(signal.SIGTERM, _exit_on_sigterm)
    if settings.api_auth == "none":
        log.warning(
            "api_auth = 'none': the API's TCP port %s is OPEN, every local user acts as admin. A development "
            'setting only: the default is api_auth = "token" (docs/security.md)',
            settings.api_url,
        )
    store = open_store(settings)
    app = create_app(store, settings)
    try:
        listeners = api_server(app, settings)
    except BaseException:
        store.close()
        raise
    applied = migrate(store)
    if applied:
        log.info("migrations applied: %s", ", ".join(applied))
    stop = threading.Event()
    pipeline = Pipeline(settings, store)
    consumer = threading.Thread(target=pipeline.run, args=(stop,), name="pipeline", daemon=True)
    consumer.start()
    app.state.pipeline = pipeline
    # system-side diagnosis: fail-slow, silent forwarding nodes, unreachable brokers, slow networks, interference
    # every [diagnosis] detect_period_s, alerts
    sysdiag = DetectionLoop(
        store,
        generator_url=settings.api_url + "/v1/anomalies",
        broker_probe=BrokerProbe(settings.kafka_bootstrap),
        mount_dir=str(settings.mount_point),
    ).start()
    app.state.sysdiag = sysdiag
    # the control loop (DFRA, live remapping, placement hints) every [control] period_s
    control = ControlLoop(store, settings, detector=sysdiag).start()
    app.state.control = control
    # the modules, the app, the store, the pipeline and the loops live as long as the process:
    # out of the full collections its polls and requests trigger
    freeze_startup_objects()
    log.info(
        "API on %s (OpenAPI at %s/docs)%s",
        settings.api_url,
        settings.api_url,
        f" and on the Unix socket {listeners.socket_path}" if listeners.socket_path else "",
    )
    try:
        listeners.run()
    finally:
        stop.set()
        control.stop()
        sysdiag.stop()
        consumer.join(timeout=30)
        store.close()
        log.info("stopped")
