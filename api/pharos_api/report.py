"""A job's visual report: one self-contained HTML page (no network when viewed).

:func:`render_report` puts together what the API knows of a job: the diagnosis in plain words
(:func:`pharos_analytics.insights.job_insights`: the pattern by Beacon's volume dominance,
insights with their evidence and recommendations), and plots made server-side with matplotlib
and embedded as PNG data URIs:

* rank x time heat map of bytes, reads and writes apart (Darshan's DXT heat map view);
* bandwidth over time with the job's phases shaded;
* request-size histogram (Darshan's access-size bins);
* bytes per storage target and per forwarding node (forwarder layer), and the top files.

Each insight shows the seconds of I/O time it cost (``seconds_lost`` of the insight, when the
analytics give one). The heat map's ``<img>`` carries where its plot areas lie in the image and
which time they span (``data-axes``, ``data-t0-ns``, ``data-span-s``), so a test can read the
rendered pixels against the job's phases.

**Live.** The report of a running job (no end event yet) shows the I/O stored so far and, when
served by the API (``http:``/``https:``), refreshes itself every ``refresh_s`` seconds: an inline
script re-fetches the page and swaps its body in, until the page it fetched is no longer of a
running job. Opened from a file it makes no request at all; a finished job's page has no script.

Every figure is binned in the store (:mod:`pharos_analytics.report_data`), so a job with
2,048 ranks and millions of requests renders in the time of a few aggregate queries.
Served at ``GET /v1/jobs/{id}/report``; written by ``pharos report JOB --html FILE``.
"""

from __future__ import annotations

import base64
import html
import io
import math
from dataclasses import asdict, dataclass
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
from pharos_core.units import lost_text

_SEV_COLOR = {"high": "#b3261e", "warn": "#a15c00", "info": "#1a5fb4"}
_CSS = """
body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#1f1f1f;line-height:1.4}
h1{font-size:1.6em;margin-bottom:.2em} h2{font-size:1.2em;margin-top:1.6em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:.9em} td,th{padding:.2em .7em;border-bottom:1px solid #eee;text-align:left}
td.n{text-align:right;font-variant-numeric:tabular-nums} .sev{font-weight:600;text-transform:uppercase}
.ins{margin:.6em 0;padding:.5em .8em;border-left:4px solid #ccc;background:#fafafa} .muted{color:#666}
img{max-width:100%} .kv td:first-child{color:#555}
.lost{font-weight:600;color:#5a3e00} .live{padding:.4em .8em;background:#e8f1fb;border-left:4px solid #1a5fb4}
"""

#: The live refresh of a running job's page (only in such a page). Served over HTTP(S) only: from a
#: file it does nothing. Each tick fetches the same URL and swaps the body in; it stops once the
#: fetched page has no ``pharos-refresh`` meta (the job ended). A failed fetch is said in the
#: banner and retried at the next tick.
_LIVE_JS = """
(function () {
  var meta = document.querySelector('meta[name="pharos-refresh"]');
  if (!meta || !/^https?:$/.test(location.protocol)) return;
  var every = 1000 * Number(meta.content);
  function tick() {
    fetch(location.href, {cache: "no-store", credentials: "same-origin"})
      .then(function (r) { if (!r.ok) throw new Error("HTTP " + r.status); return r.text(); })
      .then(function (text) {
        var doc = new DOMParser().parseFromString(text, "text/html");
        document.title = doc.title;
        document.body.replaceWith(document.adoptNode(doc.body));
        if (doc.querySelector('meta[name="pharos-refresh"]')) setTimeout(tick, every);
        else meta.remove();
      })
      .catch(function (e) {
        var s = document.getElementById("pharos-live");
        if (s) s.textContent = "Refresh failed (" + e.message + "); retrying in " + every / 1000 + " s.";
        setTimeout(tick, every);
      });
  }
  setTimeout(tick, every);
})();
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


def _img(src: str, alt: str, **data: str) -> str:
    attrs = "".join(f' data-{k.replace("_", "-")}="{_h(v)}"' for k, v in data.items())
    return f'<img src="{src}" alt="{_h(alt)}"{attrs}>'


@dataclass(frozen=True)
class Heatmap:
    """The heat map image (a PNG data URI) and where its plot areas lie: ``axes`` one
    ``(direction, left, top, right, bottom)`` per panel, fractions of the image's width and
    height from its top left corner; each area spans ``0 .. span_s`` seconds from ``t0_ns``."""

    src: str
    axes: list[tuple[str, float, float, float, float]]
    t0_ns: int
    span_s: float

    def img(self) -> str:
        return _img(
            self.src,
            "rank x time heat map",
            axes=";".join(f"{d}:{x0:.5f},{y0:.5f},{x1:.5f},{y1:.5f}" for d, x0, y0, x1, y1 in self.axes),
            t0_ns=str(self.t0_ns),
            span_s=f"{self.span_s:.6f}",
        )


def heatmap(rt: RankTime) -> Heatmap:
    """Rank x time heat map of bytes (log colour scale), one panel per direction with bytes. A
    cell without bytes is left blank (white): idle time shows as a gap."""
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
    src = _png(fig)  # draws: the constrained layout has placed the axes now
    boxes = []
    for ax, (d, _) in zip(axes[:, 0], panels, strict=True):
        b = ax.get_position()
        boxes.append((d, b.x0, 1 - b.y1, b.x1, 1 - b.y0))
    return Heatmap(src, boxes, rt.t0_ns, span_s)


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


def seconds_lost(i) -> float | None:
    """The insight's I/O seconds lost (``Insight.seconds_lost``), None when not estimated (or
    when the analytics do not estimate it at all)."""
    v = getattr(i, "seconds_lost", None)
    return None if v is None or not math.isfinite(v) else float(v)


def ordered_insights(insights: list) -> list:
    """Insights by seconds lost, most first (those without an estimate last), then severity, id
    (:func:`pharos_analytics.insights.model.order_key`: the API's and ``pharos diagnose``'s order)."""
    return sorted(insights, key=order_key)


def insight_html(i) -> str:
    """One insight: severity, title, seconds lost (``~12.3 s lost``) when estimated, message,
    recommendations, rule."""
    recs = "".join(f"<li>{_h(r)}</li>" for r in i.recommendations)
    lost = seconds_lost(i)
    return (
        f"<div class='ins' style='border-color:{_SEV_COLOR.get(i.severity, '#ccc')}'>"
        f"<span class='sev' style='color:{_SEV_COLOR.get(i.severity, '#333')}'>{_h(i.severity)}</span> "
        f"<b>{_h(i.title)}</b>"
        + (f" <span class='lost'>{lost_text(lost)}</span>" if lost is not None else "")
        + f"<br>{_h(i.message)}"
        + (f"<ul>{recs}</ul>" if recs else "")
        + f"<span class='muted'>rule: {_h(i.rule_source)}</span></div>"
    )


def render_report(
    store: Store,
    job_id: str,
    now: datetime | None = None,
    silence_s: float | None = None,
    refresh_s: float | None = None,
) -> str | None:
    """The job's report as one HTML page (str), None when the job is unknown (no event and no
    record on the client or forwarder layer). A job the agents did not watch all along (see
    :mod:`pharos_analytics.coverage`; ``silence_s`` its threshold, default the settings') gets a
    warning first in its diagnosis. A running job's page (its I/O so far) refreshes itself every
    ``refresh_s`` seconds when served over HTTP (None or 0: never). Raises StoreError."""
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
    made = now or datetime.now(UTC)
    running = (client or fwd).state == "running"
    live = running and refresh_s is not None and refresh_s > 0
    out = [
        # the icon inline: a browser asks for /favicon.ico otherwise (a request, and a 404 from the API)
        "<!doctype html><html><head><meta charset='utf-8'><link rel='icon' href='data:,'>",
        f"<title>Pharos report: job {_h(job_id)}{' (running)' if running else ''}</title><style>{_CSS}</style>",
    ]
    if live:
        out += [f'<meta name="pharos-refresh" content="{refresh_s:g}">', f"<script>{_LIVE_JS}</script>"]
    out += [
        "</head><body>",
        f"<h1>Job {_h(job_id)}</h1>",
        f"<p class='muted'>{_h(s.name or '-')} of {_h(s.user or '-')} on {_h(s.host or '-')}; "
        f"report made {_when(made)} by Pharos</p>",
    ]
    if running:
        out.append(
            f"<p class='live' id='pharos-live'>The job is running: this is its I/O stored until {_when(made)}."
            + (
                f" Served by the Pharos API, this page refreshes itself every {refresh_s:g} s until the job ends."
                if live
                else ""
            )
            + "</p>"
        )
    out += ["<h2>In short</h2>", "<table class='kv'>"]
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
    out += [insight_html(i) for i in ordered_insights(ji.insights)]
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
        out.append(heatmap(rt).img())
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
