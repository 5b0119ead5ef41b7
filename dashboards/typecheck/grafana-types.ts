// Types the generated dashboards are checked against (typecheck/check.mjs): @grafana/schema's
// Dashboard, panels with their panel plugin's Options and FieldConfig, and the ClickHouse
// plugin's SQL query model.
import type { AnnotationQuery, DataQuery, Panel } from '@grafana/schema';

// JSON holds an enum's value ("auto"), TypeScript's string enums are nominal (VisibilityMode.Auto):
// check the JSON against the same types with every string enum replaced by its values.
export type Loose<T> = T extends string
  ? `${T}`
  : T extends number | boolean | null | undefined
    ? T
    : T extends Array<infer U>
      ? Array<Loose<U>>
      : T extends object
        ? { [K in keyof T]: Loose<T[K]> }
        : T;

// grafana-clickhouse-datasource's CHSqlQuery (src/types/sql.ts), as Pharos writes it (a type
// alias, not an interface: panels' targets are Record<string, unknown>).
export type CHQuery = Omit<DataQuery, 'datasource'> & {
  datasource: { type: 'grafana-clickhouse-datasource'; uid: string };
  editorType: 'sql';
  format: 0 | 1; // sqlds: 0 time series, 1 table
  pluginVersion: string;
  queryType: 'timeseries' | 'table';
  rawSql: string;
};

// Grafana's built-in Prometheus data source's query model (PromQuery: PrometheusDataQuery of
// Grafana's public/app/plugins/datasource/prometheus/dataquery.cue, now packages/grafana-prometheus;
// @grafana/schema does not export it), as Pharos writes it.
export type PromQuery = Omit<DataQuery, 'datasource'> & {
  datasource: { type: 'prometheus'; uid: string };
  editorMode?: 'code' | 'builder';
  exemplar?: boolean;
  expr: string;
  format?: 'time_series' | 'table' | 'heatmap';
  instant?: boolean;
  range?: boolean;
  interval?: string;
  intervalFactor?: number;
  legendFormat?: string;
};

export type PanelOf<O, F = Record<string, unknown>, Q = CHQuery> = Loose<Omit<Panel<O, F>, 'options' | 'targets'>> & {
  options: Loose<O>;
  targets?: Q[];
};

export type Annotation = Loose<Omit<AnnotationQuery<CHQuery>, 'target'>> & { target?: CHQuery };
