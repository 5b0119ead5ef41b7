"""A job's visual report: one self-contained HTML page (no network when viewed).

:func:`render_report` puts together what the API knows of a job: the diagnosis in plain words
(:func:`pharos_analytics.insights.job_insights`: the pattern by Beacon's volume dominance,
insights with their evidence and recommendations), and plots made server-side with matplotlib
and embedded as PNG data URIs:

* rank x time heat map of bytes, reads and writes apart (Darshan's DXT heat map view);
* bandwidth over time with the job's phases shaded;
* request-size histogram (Darshan's access-size bins);
* bytes per storage target and per forwarding node (forwarder layer), and the top files.

Every figure is binned in the store (:mod:`pharos_analytics.report_data`), so a job with
2,048 ranks and millions of requests renders in the time of a few aggregate queries.
Served at ``GET /v1/jobs/{id}/report``; written by ``pharos report JOB --html FILE``.
"""

from __future__ import annotations

import base64
import html
import io
import math
from dataclasses import asdict
from datetime import UTC, datetime

from matplotlib.colors import LogNorm
from matplotlib.figure import Figure  # not pyplot: no global state, safe in the API's threads

from pharos_analytics.coverage import gap_lines
from pharos_analytics.insights import job_insights
from pharos_analytics.insights.model import order_key
from pharos_analytics.report_data import RankTime, rank_time_bytes, resource_bytes
from pharos_analytics.summary import job_summary
from pharos_analytics.summary_dxt import dxt_text
from pharos_analytics.summary_sql import SIZE_BINS
from pharos_analytics.summary_types import JobSummary
from pharos_core.store import Store

_SEV_COLOR = {"high": "#b3261e", "warn": "#a15c00", "info": "#1a5fb4"}
_CSS = """
body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#1f1f1f;line-height:1.4}
h1{font-size:1.6em;margin-bottom:.2em} h2{font-size:1.2em;margin-top:1.6em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:.9em} td,th{padding:.2em .7em;border-bottom:1px solid #eee;text-align:left}
td.n{text-align:right;font-variant-numeric:tabular-nums} .sev{font-weight:600;text-transform:uppercase}
.ins{margin:.6em 0;padding:.5em .8em;border-left:4px solid #ccc;background:#fafafa} .muted{color:#666}
img{max-width:100%} .kv td:first-child{color:#555}
"""


def _h(x) -> str:
    return html.escape(str(x))


def _bytes(n: float | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def _png(fig: Figure) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=96)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _img(src: str, alt: str) -> str:
    return f'<img src="{src}" alt="{_h(alt)}">'


def heatmap_png(rt: RankTime) -> str:
    """Rank x time heat map of bytes (log colour scale), one panel per direction with bytes."""
    panels = [(d, m) for d, m in (("write", rt.write), ("read", rt.read)) if any(any(row) for row in m)]
    panels = panels or [("write", rt.write)]  # no bytes at all: one empty panel
    fig = Figure(figsize=(10, 2.2 + min(rt.rows, 64) * 0.05 * len(panels)), layout="constrained")
    axes = fig.subplots(len(panels), 1, squeeze=False)
    span_s = rt.bins * rt.bin_ns / 1e9
    for ax, (d, m) in zip(axes[:, 0], panels, strict=True):
        vmax = max(max(row) for row in m)
        im = ax.imshow(
            [[v if v > 0 else math.nan for v in row] for row in m],
            aspect="auto",
            interpolation="nearest",
            origin="lower",
            extent=(0, span_s, rt.rank_min - 0.5, rt.rank_min + rt.rows * rt.ranks_per_row - 0.5),
            norm=LogNorm(vmin=max(vmax / 1e4, 1), vmax=max(vmax, 2)),
            cmap="viridis",
        )
        ax.set_ylabel("rank" if rt.ranks_per_row == 1 else f"rank ({rt.ranks_per_row} per row)")
        ax.set_title(f"{d}s: bytes per rank and {rt.bin_ns / 1e9:.3g} s bin", fontsize=10)
        fig.colorbar(im, ax=ax, label="bytes")
    axes[-1, 0].set_xlabel("seconds since the job's first I/O")
    return _png(fig)


def bandwidth_png(rt: RankTime, phases: list[tuple[float, float, int]]) -> str:
    """Read and write bandwidth (MiB/s) per time bin, the job's phases shaded and numbered."""
    fig = Figure(figsize=(10, 2.8), layout="constrained")
    ax = fig.subplots()
    x = [(i + 0.5) * rt.bin_ns / 1e9 for i in range(rt.bins)]
    for d, color in (("write", "#c0392b"), ("read", "#2874a6")):
        y = [v / 2**20 for v in rt.bandwidth(d)]
        if any(y):
            ax.plot(x, y, color=color, label=d, linewidth=1.2)
    for s, e, idx in phases:
        ax.axvspan(s, e, color="#999", alpha=0.12)
        ax.text(s, 1.0, f" {idx}", transform=ax.get_xaxis_transform(), va="top", fontsize=8, color="#555")
    ax.set_xlabel("seconds since the job's first I/O")
    ax.set_ylabel("MiB/s")
    ax.legend(loc="upper right", fontsize=8)
    ax.set_title("bandwidth over time (phases shaded)", fontsize=10)
    return _png(fig)


def sizes_png(s: JobSummary) -> str:
    """Requests per Darshan access-size bin, reads and writes side by side."""
    labels = [label for label, _ in SIZE_BINS]
    fig = Figure(figsize=(10, 2.8), layout="constrained")
    ax = fig.subplots()
    w = 0.4
    for k, (d, color) in enumerate((("read", "#2874a6"), ("write", "#c0392b"))):
        ys = [s.size_histogram.get(d, {}).get(label, 0) for label in labels]
        ax.bar([i + (k - 0.5) * w for i in range(len(labels))], ys, width=w, color=color, label=d)
    ax.set_xticks(range(len(labels)), labels, rotation=30, fontsize=8)
    ax.set_ylabel("requests")
    ax.set_yscale("symlog")
    ax.legend(fontsize=8)
    ax.set_title("request sizes (Darshan's bins)", fontsize=10)
    return _png(fig)


def resources_png(res: dict[str, dict[str, int]]) -> str | None:
    """Bytes per storage target and per forwarding node; None when the job was not forwarded."""
    kinds = [(k, v) for k, v in res.items() if v]
    if not kinds:
        return None
    fig = Figure(figsize=(10, 2.8), layout="constrained")
    axes = fig.subplots(1, len(kinds), squeeze=False)
    for ax, (k, v) in zip(axes[0], kinds, strict=True):
        names = sorted(v)
        ax.bar(names, [v[n] / 2**20 for n in names], color="#6c5b7b")
        ax.set_title(f"MiB per {k.replace('_', ' ')}", fontsize=10)
        ax.tick_params(axis="x", labelrotation=30, labelsize=8)
    return _png(fig)


def _when(d: datetime | None) -> str:
    return d.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC") if d else "-"


def _gaps_html(s: JobSummary) -> list[str]:
    """The coverage warning of the diagnosis: the job is incomplete, where and when."""
    if s.complete:
        return []
    items = "".join(f"<li>{_h(line)}</li>" for line in gap_lines(s.gaps))
    silence = s.coverage.silence_s if s.coverage else 0
    return [
        f"<div class='ins' style='border-color:{_SEV_COLOR['high']}'>"
        f"<span class='sev' style='color:{_SEV_COLOR['high']}'>high</span> "
        "<b>Incomplete: the eBPF agent was not watching for part of this job</b><br>"
        f"No batch (records or heartbeat) came from any agent on these hosts for more than {silence:g} s "
        f"while the job ran: its requests there are missing, so every figure below is a lower bound.<ul>{items}</ul>"
        "<span class='muted'>rule: heartbeats (pharos_analytics.coverage); restart the agent "
        "(pharos up, or its systemd unit) and rerun the job for a full trace</span></div>"
    ]


def render_report(store: Store, job_id: str, now: datetime | None = None, silence_s: float | None = None) -> str | None:
    """The job's report as one HTML page (str), None when the job is unknown (no event and no
    record on the client or forwarder layer). A job the agents did not watch all along (see
    :mod:`pharos_analytics.coverage`; ``silence_s`` its threshold, default the settings') gets a
    warning first in its diagnosis. Raises StoreError."""
    client = job_summary(store, job_id, "client", files_limit=20, silence_s=silence_s)
    fwd = job_summary(store, job_id, "forwarder", files_limit=20, coverage=client is None, silence_s=silence_s)
    if client is None and fwd is None:
        return None
    # the client layer (what the application asked for) unless only the daemons saw its data
    s, layer = (client, "client") if client is not None else (fwd, "forwarder")
    cov = s  # the summary that carries the agents' coverage
    if not s.data_requests and fwd is not None and fwd.data_requests:
        s, layer = fwd, "forwarder"
    ji = job_insights(store, job_id)
    rt = rank_time_bytes(store, job_id, layer)
    res = resource_bytes(store, job_id)
    prof = ji.phases.job
    out = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>Pharos report: job {_h(job_id)}</title><style>{_CSS}</style></head><body>",
        f"<h1>Job {_h(job_id)}</h1>",
        f"<p class='muted'>{_h(s.name or '-')} of {_h(s.user or '-')} on {_h(s.host or '-')}; "
        f"report made {_when(now or datetime.now(UTC))} by Pharos</p>",
        "<h2>In short</h2>",
        "<table class='kv'>",
    ]
    detail = ", ".join(f"{d}s {p}" for d, p in s.patterns.items() if p != "none")
    rows = [
        ("state", f"{s.state} (exit code {s.exit_code if s.exit_code is not None else '-'})"),
        ("time", f"{_when(s.start)} to {_when(s.end)}"),
        ("ranks", f"{s.ranks if s.ranks is not None else '-'} ({s.io_ranks} did data I/O)"),
        ("compute nodes", f"{len(s.compute_nodes)}: {', '.join(s.compute_nodes)}" if s.compute_nodes else "-"),
        (
            "I/O pattern",
            f"{s.pattern}"
            + (f" ({detail})" if detail else "")
            + f" - Beacon's volume dominance; all files together {s.fan_in_pattern}",
        ),
        ("bytes", f"{_bytes(s.bytes_written)} written, {_bytes(s.bytes_read)} read, {s.n_files} data file(s)"),
        ("requests", f"{s.data_requests} data requests, {sum(s.ops.values())} file operations"),
        (
            "I/O time",
            f"{s.io_time_s:.2f} s summed over ranks; span {s.io_span_s or 0:.2f} s; {s.bandwidth_mib_s or 0:.1f} MiB/s",
        ),
        ("layer shown", f"{layer} ({'eBPF agent' if layer == 'client' else 'forwarding daemons'})"),
    ]
    if s.source != "traces":
        rows.append(("source", f"{s.source}: totals from the Darshan module counters"))
    if s.dxt is not None:
        rows.append(
            ("DXT", dxt_text(asdict(s.dxt)) + ("; phases and heat map show that part" if s.dxt.partial else ""))
        )
    if s.dropped_records:
        rows.append(("dropped records", f"{s.dropped_records} (the figures are a lower bound)"))
    if not cov.complete:
        rows.append(("coverage", f"INCOMPLETE: {len(cov.gaps)} gap(s) without a live agent (see the diagnosis)"))
    out += [f"<tr><td>{_h(k)}</td><td>{_h(v)}</td></tr>" for k, v in rows]
    out.append("</table>")

    out.append("<h2>Diagnosis</h2>")
    out += _gaps_html(cov)
    if not ji.insights:
        out.append("<p>No rule fired: nothing in this job's I/O stands out.</p>")
    for i in sorted(ji.insights, key=order_key):
        recs = "".join(f"<li>{_h(r)}</li>" for r in i.recommendations)
        out.append(
            f"<div class='ins' style='border-color:{_SEV_COLOR.get(i.severity, '#ccc')}'>"
            f"<span class='sev' style='color:{_SEV_COLOR.get(i.severity, '#333')}'>{_h(i.severity)}</span> "
            f"<b>{_h(i.title)}</b><br>{_h(i.message)}"
            + (f"<ul>{recs}</ul>" if recs else "")
            + f"<span class='muted'>rule: {_h(i.rule_source)}</span></div>"
        )
    for n in ji.notes:
        out.append(f"<p class='muted'>{_h(n)}</p>")

    out.append("<h2>When and where the bytes moved</h2>")
    if rt is None:
        out.append(
            "<p class='muted'>No per-request trace on this layer (e.g. a Darshan log without DXT): "
            "no heat map or timeline.</p>"
        )
    else:
        t0 = rt.t0_ns / 1e9
        spans = [
            (p.profile.start.timestamp() - t0, p.profile.end.timestamp() - t0, p.index)
            for p in ji.phases.phases
            if p.profile.start and p.profile.end
        ]
        out.append(_img(heatmap_png(rt), "rank x time heat map"))
        out.append(_img(bandwidth_png(rt, spans), "bandwidth over time"))
        out.append(
            f"<p class='muted'>{rt.records} stored records binned into {rt.bins} time bins of "
            f"{rt.bin_ns / 1e9:.3g} s and {rt.rows} rank rows.</p>"
        )
    out.append(_img(sizes_png(s), "request sizes"))

    if ji.phases.phases:
        out.append("<h2>Phases</h2><table><tr><th>#</th><th>start</th><th>s</th><th>pattern</th>")
        out.append("<th>written</th><th>read</th><th>access</th><th>sizes</th><th>metadata ops</th></tr>")
        for p in ji.phases.phases:
            q = p.profile
            out.append(
                f"<tr><td>{p.index}</td><td>{_when(q.start)}</td><td class='n'>{q.duration_s:.2f}</td>"
                f"<td>{_h(q.pattern)}</td><td class='n'>{_bytes(q.bytes_written)}</td>"
                f"<td class='n'>{_bytes(q.bytes_read)}</td><td>{_h(q.access)}</td><td>{_h(q.size_class)}</td>"
                f"<td class='n'>{q.metadata_ops}</td></tr>"
            )
        out.append("</table>")
    elif prof is None:
        out.append("<p class='muted'>No phases: the job has no data requests.</p>")

    out.append("<h2>Files and targets</h2>")
    if img := resources_png(res):
        out.append(_img(img, "bytes per target and forwarding node"))
    out.append("<table><tr><th>file</th><th>written</th><th>read</th><th>requests</th><th>ranks</th></tr>")
    for f in s.files:
        out.append(
            f"<tr><td>{_h(f.path)}</td><td class='n'>{_bytes(f.bytes_written)}</td>"
            f"<td class='n'>{_bytes(f.bytes_read)}</td><td class='n'>{f.reads + f.writes}</td>"
            f"<td class='n'>{f.ranks}</td></tr>"
        )
    out.append("</table>")
    if s.n_files > len(s.files):
        out.append(f"<p class='muted'>{s.n_files - len(s.files)} more file(s) not listed.</p>")
    out.append("</body></html>")
    return "\n".join(out)
