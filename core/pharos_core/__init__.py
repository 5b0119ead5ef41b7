"""The ground floor every Pharos package may import: settings (:mod:`.settings`), the store
and its migrations (:mod:`.store`, ``migrations/``), the cluster variant of the schema
(:mod:`.cluster_schema`) and Pharos's own Prometheus metrics (:mod:`.telemetry`).

Nothing here imports the pipeline, the analytics or the API.
"""
