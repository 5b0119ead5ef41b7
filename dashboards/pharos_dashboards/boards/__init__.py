"""The Pharos ClickHouse dashboards, one module per board: system overview, job, forwarding
nodes, storage targets, anomalies and control actions; what they share is in
:mod:`.common`."""

from __future__ import annotations

from .anomalies import anomalies
from .forwarders import forwarders
from .job import job
from .overview import overview
from .targets import targets

BOARDS = (overview, job, forwarders, targets, anomalies)
