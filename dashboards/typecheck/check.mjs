// Type-checks Grafana dashboard JSON files with tsc --strict against @grafana/schema:
//   node typecheck/check.mjs [--out DIR] FILE_OR_DIR...
// Each dashboard becomes a TypeScript module (in DIR, default .typecheck/) where every panel is
// declared with its panel plugin's Options/FieldConfig types, every query as its data source's
// query model (the ClickHouse plugin's, or Prometheus's for panels of a prometheus data source),
// and the whole as @grafana/schema's Dashboard; object literals make tsc reject unknown
// properties as well as wrong types. Exit status: tsc's.
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const root = path.dirname(here);
const args = process.argv.slice(2);
let out = path.join(root, '.typecheck', 'dashboards');
if (args[0] === '--out') {
  out = path.resolve(args[1]);
  args.splice(0, 2);
}
const files = args.flatMap((a) =>
  fs.statSync(a).isDirectory()
    ? fs.readdirSync(a).filter((f) => f.endsWith('.json')).sort().map((f) => path.join(a, f))
    : [a],
);
if (files.length === 0) {
  console.error('no dashboard JSON given');
  process.exit(2);
}

// Panel type -> the module of @grafana/schema with its Options (and FieldConfig).
const PANELS = {
  timeseries: ['timeseries', 'TimeSeriesPanelCfg', true],
  table: ['table', 'TablePanelCfg', true],
  stat: ['stat', 'StatPanelCfg', false],
  heatmap: ['heatmap', 'HeatmapPanelCfg', true],
  barchart: ['barchart', 'BarChartPanelCfg', true],
  'state-timeline': ['statetimeline', 'StateTimelinePanelCfg', true],
  text: ['text', 'TextPanelCfg', false],
};
const ident = (t) => 'P_' + t.replace(/[^A-Za-z0-9]/g, '_');

fs.rmSync(out, { recursive: true, force: true });
fs.mkdirSync(out, { recursive: true });
fs.copyFileSync(path.join(here, 'grafana-types.ts'), path.join(out, 'grafana-types.ts'));
const lit = (v) => JSON.stringify(v, null, 2);
for (const file of files) {
  const d = JSON.parse(fs.readFileSync(file, 'utf8'));
  const used = new Set();
  const decls = [];
  const names = [];
  (d.panels ?? []).forEach((p, i) => {
    const name = `panel${i}`;
    names.push(name);
    if (p.type === 'row') {
      decls.push(`const ${name}: Loose<RowPanel> = ${lit(p)};`);
      return;
    }
    const spec = PANELS[p.type];
    if (!spec) {
      decls.push(`const ${name}: never = ${lit(p)}; // unknown panel type ${JSON.stringify(p.type)}`);
      return;
    }
    used.add(p.type);
    const m = ident(p.type);
    const fc = spec[2] ? `${m}.FieldConfig` : 'Record<string, unknown>';
    const q = p.datasource?.type === 'prometheus' ? 'PromQuery' : 'CHQuery';
    decls.push(`const ${name}: PanelOf<${m}.Options, ${fc}, ${q}> = ${lit(p)};`);
  });
  const { panels: _p, annotations, ...rest } = d;
  const imports = [...used].map(
    (t) =>
      `import type * as ${ident(t)} from '@grafana/schema/dist/esm/raw/composable/${PANELS[t][0]}/panelcfg/x/${PANELS[t][1]}_types.gen';`,
  );
  const ts = [
    `import type { Dashboard, RowPanel } from '@grafana/schema';`,
    `import type { Annotation, CHQuery, Loose, PanelOf, PromQuery } from './grafana-types';`,
    ...imports,
    '',
    ...decls,
    `const annotations: { list: Annotation[] } = ${lit(annotations ?? { list: [] })};`,
    `const rest: Loose<Omit<Dashboard, 'panels' | 'annotations'>> = ${lit(rest)};`,
    `export const dashboard: Loose<Dashboard> = { ...rest, annotations, panels: [${names.join(', ')}] };`,
    '',
  ];
  fs.writeFileSync(path.join(out, path.basename(file, '.json').replace(/[^A-Za-z0-9_-]/g, '_') + '.ts'), ts.join('\n'));
}
fs.writeFileSync(
  path.join(out, 'tsconfig.json'),
  lit({
    compilerOptions: {
      strict: true,
      noEmit: true,
      target: 'es2022',
      module: 'esnext',
      moduleResolution: 'bundler',
      types: [],
      skipLibCheck: true,
    },
    include: ['*.ts'],
  }),
);
const tsc = path.join(root, 'node_modules', 'typescript', 'bin', 'tsc');
try {
  execFileSync(process.execPath, [tsc, '-p', path.join(out, 'tsconfig.json'), '--pretty', 'false'], { stdio: 'inherit' });
  console.log(`${files.length} dashboard(s) type-check against @grafana/schema (tsc --strict)`);
} catch (e) {
  process.exit(e.status ?? 1);
}
