#!/bin/bash
# Run once by the clickhouse-server image on its first start (empty data volume): Grafana's
# read-only user. readonly = 2 lets the plugin set query settings (max_execution_time); the
# grant on the database covers the tables the Pharos migrations create later. On an existing
# volume, run the same statements with clickhouse-client (docs/operations.md, "Upgrade").
set -euo pipefail
clickhouse client --user "$CLICKHOUSE_USER" --password "$CLICKHOUSE_PASSWORD" --multiquery <<SQL
CREATE SETTINGS PROFILE IF NOT EXISTS grafana_readonly SETTINGS readonly = 2, max_execution_time = 60;
CREATE USER IF NOT EXISTS grafana IDENTIFIED WITH sha256_password BY '${GRAFANA_CLICKHOUSE_PASSWORD}'
    SETTINGS PROFILE 'grafana_readonly';
GRANT SELECT ON ${CLICKHOUSE_DB}.* TO grafana;
SQL
