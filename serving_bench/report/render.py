"""Report data (see :mod:`serving_bench.report.collect`) -> one self-contained HTML page.

Everything is inline: CSS, SVG charts drawn here, and a short script (legend toggling, sortable tables). The page
fetches nothing. The recommendation in plain words comes first.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from html import escape

from serving_bench.report.svg import LineChart, heat_map
from serving_bench.run.metrics import simulated_inside

CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0 auto;max-width:1100px;padding:16px;color:#222}
h1{font-size:22px}h2{font-size:18px;border-bottom:1px solid #ddd;padding-bottom:4px;margin-top:32px}
.recommendation{background:#eef6ee;border-left:5px solid #2ca02c;padding:10px 14px}
.recommendation.bad{background:#fbeeee;border-left-color:#d62728}
.charts{display:flex;flex-wrap:wrap;gap:12px}.chart{width:100%;max-width:640px;height:auto;background:#fff}
.chart text{font-size:11px;fill:#333}.chart .ct{font-size:13px;font-weight:600}
.chart .axis line{stroke:#555}.chart .axis line.grid{stroke:#e8e8e8}.chart .ref line{stroke:#d62728;stroke-dasharray:4 3}
.chart .ref text{fill:#d62728}.legend-item{cursor:pointer}.series.off{display:none}.legend-item.off{opacity:.35}
table{border-collapse:collapse;margin:8px 0}th,td{border:1px solid #ddd;padding:3px 8px;text-align:right}
th{background:#f4f4f4;cursor:pointer}td:first-child,th:first-child{text-align:left}.empty{color:#777}
.note{color:#555;font-size:13px}
"""

SCRIPT = """
(function(){
  var data = JSON.parse(document.getElementById('report-data').textContent);
  document.querySelectorAll('.legend-item').forEach(function(item){
    item.addEventListener('click', function(){
      var svg = item.closest('svg'), name = item.getAttribute('data-series');
      item.classList.toggle('off');
      svg.querySelectorAll('.series').forEach(function(s){
        if (s.getAttribute('data-series') === name) s.classList.toggle('off');
      });
    });
  });
  document.querySelectorAll('table.sortable th').forEach(function(th){
    var col = th.cellIndex;
    th.addEventListener('click', function(){
      var table = th.closest('table'), body = table.tBodies[0];
      var rows = Array.prototype.slice.call(body.rows), asc = th.getAttribute('data-asc') !== '1';
      rows.sort(function(a, b){
        var x = a.cells[col].getAttribute('data-v') || a.cells[col].textContent;
        var y = b.cells[col].getAttribute('data-v') || b.cells[col].textContent;
        var nx = parseFloat(x), ny = parseFloat(y);
        var c = (!isNaN(nx) && !isNaN(ny)) ? nx - ny : String(x).localeCompare(String(y));
        return asc ? c : -c;
      });
      rows.forEach(function(r){ body.appendChild(r); });
      th.setAttribute('data-asc', asc ? '1' : '0');
    });
  });
  var sections = document.querySelectorAll('section').length;
  var status = document.getElementById('js-status');
  status.textContent = 'interactive: ' + sections + ' sections, ' + (data.cdfs || []).length + ' latency series';
  status.setAttribute('data-ready', '1');
})();
"""


def _ms(v) -> str:
    return "–" if v is None else f"{v * 1e3:.2f}"


def _num(v, digits: int = 1) -> str:
    return "–" if v is None else f"{v:,.{digits}f}"


def _table(headers: list[str], rows: list[list], table_id: str) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = []
    for row in rows:
        cells = []
        for cell in row:
            if isinstance(cell, tuple):  # (text, sort value)
                cells.append(f'<td data-v="{escape(str(cell[1]))}">{escape(str(cell[0]))}</td>')
            else:
                cells.append(f"<td>{escape(str(cell))}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return (f'<table class="sortable" id="{escape(table_id)}"><thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(body)}</tbody></table>')


def recommendation_section(data: dict) -> str:
    lines, bad = [], False
    for part in ("tune", "plan"):
        block = data.get(part) or {}
        lines += block.get("recommendation", [])
        bad = bad or (part == "tune" and block and not block.get("satisfiable", True))
    if not lines:
        lines = ["No tuning or planning results in this folder: run `serving-bench tune` or `serving-bench plan` "
                 "with --out inside it."]
        bad = True
    items = "".join(f"<p>{escape(line)}</p>" for line in lines)
    return (f'<section id="recommendation"><h2>Recommendation</h2>'
            f'<div class="recommendation{" bad" if bad else ""}">{items}</div></section>')


def cdf_section(data: dict) -> str:
    by_model = defaultdict(list)
    for c in data.get("cdfs", []):
        by_model[c["model"]].append((f'{c["source"]} (n={c["n"]})', [v * 1e3 for v in c["latency_s"]], c["q"]))
    slos = (data.get("tune") or {}).get("slos", {})
    charts = []
    for i, (model, series) in enumerate(sorted(by_model.items())):
        charts.append(LineChart(title=f"{model}: latency CDF", x_label="latency from intended time (ms, log)",
                                y_label="fraction of requests", chart_id=f"cdf-{i}", markers=False, step=True,
                                log_x=True).svg(series))
        if model in slos:
            charts[-1] += f'<p class="note">SLO for {escape(model)}: ' + ", ".join(
                f"{escape(s)} ≤ {b * 1e3:g} ms" for s, b in slos[model].items()) + "</p>"
    body = "".join(charts) or '<p class="empty">No request records in this folder.</p>'
    return f'<section id="latency-cdfs"><h2>Latency CDFs per model</h2><div class="charts">{body}</div></section>'


def curves_section(data: dict) -> str:
    tune = data.get("tune") or {}
    top = tune.get("top", [])[:5]
    slos = tune.get("slos", {})
    models = sorted({m for t in top for p in t["result"].get("probes", []) for m in p.get("models", {})})
    charts = []
    for i, model in enumerate(models):
        series = []
        for t in top:
            probes = [p for p in t["result"].get("probes", []) if model in p.get("models", {})]
            probes.sort(key=lambda p: p["scale"])
            series.append((f'#{t["rank"]}', [p["models"][model]["throughput_rps"] for p in probes],
                           [(p["models"][model]["p99_s"] or math.nan) * 1e3 for p in probes]))
        bound = slos.get(model, {}).get("p99")
        hl = [(f"SLO p99 {bound * 1e3:g} ms", bound * 1e3)] if bound else []
        charts.append(LineChart(title=f"{model}: throughput vs p99 (simulated)", x_label="throughput (req/s)",
                                y_label="p99 latency (ms)", chart_id=f"curve-{i}", hlines=hl,
                                y_max=4 * bound * 1e3 if bound else None).svg(series))
    body = "".join(charts) or '<p class="empty">No tuning results.</p>'
    note = ('<p class="note">Each point is the candidate run on the simulator at a multiple of the profile\'s load; '
            'numbers (#1, #2, ...) are the ranks of the top candidates; p99 above four times the SLO is drawn at the '
            'top edge.</p>') if charts else ""
    return f'<section id="throughput-p99"><h2>Throughput vs p99</h2>{note}<div class="charts">{body}</div></section>'


def telemetry_section(data: dict) -> str:
    series = [(f'{s["source"]}: {s["name"]}', s["t_s"], s["value"]) for s in data.get("telemetry", [])]
    body = LineChart(title="Utilisation over time", x_label="time (s)", y_label="utilisation",
                     chart_id="utilisation", markers=False).svg(series) if series else \
        '<p class="empty">No telemetry in this folder (GPU/CPU utilisation is sampled during replays).</p>'
    return f'<section id="utilisation-section"><h2>GPU/CPU utilisation over time</h2>{body}</section>'


def heatmap_section(data: dict) -> str:
    obs = data.get("observations", [])
    models = sorted({k.split(".")[0] for o in obs for k in o["params"] if k.endswith(".instances")})
    charts = []
    for i, model in enumerate(models):
        best: dict = {}
        for o in obs:
            r = o["result"]
            if not r.get("feasible"):
                continue
            cell = (o["params"][f"{model}.instances"], o["params"][f"{model}.max_batch_size"])
            best[cell] = max(best.get(cell, 0.0), r.get("capacity_rps") or 0.0)
        rows = sorted({o["params"][f"{model}.instances"] for o in obs})
        cols = sorted({o["params"][f"{model}.max_batch_size"] for o in obs})
        values = [[best.get((r, c)) for c in cols] for r in rows]
        charts.append(heat_map([str(r) for r in rows], [str(c) for c in cols], values,
                               title=f"{model}: best capacity (req/s)",
                               chart_id=f"heatmap-{i}", value_label="req/s", row_label="instances",
                               col_label="max_batch_size"))
    body = "".join(charts) or '<p class="empty">No search observations.</p>'
    note = ('<p class="note">Per tuned model: the best capacity (all models\' load, req/s, meeting every SLO) among the '
            'configurations searched with that instance count and max_batch_size; grey: none met the SLOs or none was '
            'searched.</p>') if charts else ""
    return (f'<section id="instance-heatmap"><h2>Instance count heat map</h2>{note}<div class="charts">{body}</div>'
            '</section>')


LATENCY_METRICS = ("p50", "p90", "p95", "p99", "p99.9", "mean", "server mean", "send late p99")


def _metric_format(metric: str):
    """(label, formatter) for a comparison row's metric: latencies in ms, utilisation in %, others as numbers."""
    name = metric[:-2] if metric.endswith("_s") else metric
    if name in LATENCY_METRICS:
        return f"{name} (ms)", _ms
    if "util" in name:
        return f"{name} (%)", lambda v: "–" if v is None else f"{v * 100:.1f}"
    if name.startswith("throughput"):
        return f"{name.replace('_rps', '')} (req/s)", lambda v: _num(v, 1)
    return name.replace("_", " "), lambda v: _num(v, 2)


def validation_section(data: dict) -> str:
    rows = []
    for r in data.get("validation", []):
        err = r.get("rel_error")
        if err is None and r.get("simulated") is not None and r.get("measured"):
            err = (r["simulated"] - r["measured"]) / r["measured"]
        label, fmt = _metric_format(str(r.get("metric", "")))
        inside = simulated_inside(r)
        ends = ["…" if r.get(end) is None else fmt(r[end]) for end in ("measured_low", "measured_high")]
        interval = "–" if inside is None else f"{ends[0]} – {ends[1]}" + ("" if inside else " (simulated outside)")
        low, high, verdict = r.get("predicted_low"), r.get("predicted_high"), r.get("inside")
        predicted = "–" if low is None or high is None else f"{fmt(low)} – {fmt(high)}"
        rows.append([r.get("source", ""), r.get("model", ""), label,
                     (fmt(r.get("simulated")), r.get("simulated") or 0), (fmt(r.get("measured")), r.get("measured") or 0),
                     (predicted, low or 0), ("–" if verdict is None else "yes" if verdict else "no", int(bool(verdict))),
                     (interval, r.get("measured_low") or 0),
                     ("–" if err is None else f"{err * 100:+.1f} %", err if err is not None else 0)])
    headers = ["source", "model", "metric", "simulated", "measured", "predicted interval", "measured inside",
               "measured 95 % interval", "error"]
    body = _table(headers, rows, "sim-vs-measured") if rows \
        else '<p class="empty">No simulated-vs-measured comparison in this folder.</p>'
    note = ('<p class="note">Error = (simulated − measured) / measured, for the same schedule on the simulator and on '
            'real Triton. The predicted interval is taken over seeded replications of the simulation, each on its own '
            'draw of the host\'s speed (the profile\'s host spread); “measured inside” says whether the replay fell '
            'in it. A measured percentile\'s 95 % interval is distribution-free (order statistics of the '
            'requests in the window); “…” is an end too few requests bound — an error inside the interval is within '
            'what the replay itself can tell.</p>') if rows else ""
    note += "".join(f'<p class="note coverage">{escape(coverage_text(c))}</p>' for c in data.get("coverage", []))
    note += "".join(f'<p class="note">Note: {escape(n)}</p>' for n in data.get("validation_notes", []))
    return f'<section id="sim-vs-measured-section"><h2>Simulated vs measured</h2>{note}{body}</section>'


def coverage_text(c: dict) -> str:
    """A validation's coverage (``validation.json``'s ``coverage``) in one sentence."""
    text = (f"{c.get('source', '')}: coverage {c['inside']} of {c['rows']} measured figures "
            f"({', '.join(c.get('metrics') or [])}) inside their predicted {c['confidence']:.0%} interval "
            f"({c['coverage']:.0%}); median half-width {c['median_half_width'] * 100:.1f} %")
    if c.get("width_ratio") is not None:
        text += (f"; on the percentiles {c['median_half_width_vs_own'] * 100:.1f} % against the measurement's own "
                 f"{c['median_measured_spread'] * 100:.1f} % ({c['width_ratio']:.2f}×)")
    about = c.get("replications") or {}
    if about:
        text += (f"; {about.get('count')} replications, host spread {about.get('host_spread', 0) * 100:.1f} % "
                 f"({about.get('host_spread_source', '')})")
    return text + "."


def capacity_section(data: dict) -> str:
    """Tune's verification: each verified candidate's replays on Triton and the capacity they bracket."""
    tune = data.get("tune") or {}
    rows, growth = [], tune.get("growth", "superpose")
    for v in tune.get("verification", []):
        check, replays = v.get("capacity"), v.get("replays") or []
        if not check:
            continue
        met, failed = check.get("measured_met_scale"), check.get("measured_failed_scale")
        bracket = ("< " + _scale(failed) if met is None else "≥ " + _scale(met) if failed is None else
                   f"{_scale(met)} – {_scale(failed)}")
        held = check.get("held_at_capacity")
        rows.append([v["rank"], (_scale(check["predicted_scale"]) + (" (top)" if check.get("capped") else ""),
                                 check["predicted_scale"]),
                     ", ".join(f'{_scale(r["scale"])} {"met" if r["slo_met"] else "missed"}'
                               for r in sorted(replays, key=lambda r: r["scale"])),
                     bracket, "–" if held is None else "yes" if held else "no",
                     "yes" if check.get("agrees") else "no", _interval_verdict(check.get("interval"))])
    if not rows:
        return ""
    seconds = ", ".join(sorted({f'{r["duration_s"]:.1f} s' for v in tune["verification"]
                              for r in v.get("replays") or []}))
    note = (f'<p class="note">Each verified candidate replayed on real Triton at 1×, at its predicted capacity and '
            f'one ladder rung above ({seconds} a replay); a capacity at the top of the search (top) only there. The '
            f'load is grown by {escape(growth)} ({escape(tune.get("growth_meaning", ""))}). Measured capacity: '
            'between the highest replay that met every SLO and the lowest that missed one. Where the replays disagree '
            'with the prediction and the pick has a capacity interval, it is replayed once more at the interval\'s end '
            'they point to; the last column says whether the measured capacity lies inside the interval.</p>')
    table = _table(["rank", "predicted capacity (× load)", "replays", "measured capacity (× load)",
                    "SLOs held at the predicted capacity", "as predicted", "capacity interval"], rows,
                   "capacity-table")
    return f'<section id="capacity-verification"><h2>Capacity verified on Triton</h2>{note}{table}</section>'


def _scale(value: float) -> str:
    return f"{value:.2f}×"


def _interval_verdict(interval: dict | None) -> str:
    """A verified candidate's capacity interval and whether the measured capacity lies inside it."""
    if not interval:
        return "–"
    verdict = {True: "holds", False: "missed", None: "not settled"}[interval["holds"]]
    return f'{_scale(interval["low_scale"])} – {_scale(interval["high_scale"])}: {verdict}'


def top_section(data: dict) -> str:
    tune = data.get("tune") or {}
    rows = []
    for t in tune.get("top", []):
        r = t["result"]
        config = "; ".join(f'{m}: {c["instances"]}×, batch ≤ {c["max_batch_size"]}, delay {c["max_queue_delay_us"]} µs'
                           + (f', {c["device"]}' if c.get("device") else "") for m, c in t.get("config", {}).items())
        rows.append([(f'{t["rank"]} (screen)' if t.get("screened") else t["rank"], t["rank"]),
                     ("yes" if r["feasible"] else "no", int(r["feasible"])),
                     (_num(r["capacity_rps"]), r["capacity_rps"]), (f'{r["capacity_scale"]:.2f}×', r["capacity_scale"]),
                     _interval_cell(r.get("capacity_interval")), r["gpus"], r["instances"], config])
    growth = tune.get("growth", "superpose")
    confidence = (tune.get("intervals") or {}).get("confidence", 0.9)
    body = _table(["rank", "meets SLOs", f"capacity (req/s, {growth})", f"× load ({growth})",
                   f"{confidence:.0%} interval (× load)", "GPUs", "instances", "configuration"], rows,
                  "top-configs") if rows else '<p class="empty">No tuning results.</p>'
    search = tune.get("search", {})
    note = (f'<p class="note">Searched {search.get("evaluated", 0) + search.get("resumed", 0)} configurations '
            f'({search.get("generator", "?")}, {search.get("executor", "?")} executor, '
            f'{search.get("wall_s", 0):.1f} s) of {search.get("space_points", "?")}'
            + (_screen_note(search["screen"]) if search.get("screen") else "") + '.</p>') if search else ""
    return f'<section id="top-configurations"><h2>Top configurations</h2>{note}{body}</section>'


def _interval_cell(found: dict | None) -> tuple[str, float]:
    """A capacity interval (``capacity_interval``) as a table cell: ``low – high``, or – where none was found;
    ``(extrapolated)`` where it reaches above the busiest load the profile measured."""
    if not found or found.get("low_scale") is None:
        return "–", 0
    beyond = " (extrapolated)" if found.get("extrapolated") else ""
    return f'{found["low_scale"]:.2f} – {found["high_scale"]:.2f}{beyond}', found["low_scale"]


def _screen_note(screen: dict) -> str:
    return (f', ranked on a screen of {screen["fraction"]:.1%} of the load\'s time ({screen["requests"]:,} requests); '
            f'the best {screen["confirmed"]} simulated on the whole load ({screen["confirm_wall_s"]:.1f} s); rows '
            f'marked (screen) carry screen figures')


def plan_section(data: dict) -> str:
    plan = data.get("plan")
    if not plan:
        return ""
    rows = []
    for row in plan.get("rows", []):
        rows.append([f'{row["growth"]:g}×', row["gpus"] if row.get("gpus") is not None else "not met",
                     (_num(row.get("offered_rps")), row.get("offered_rps") or 0),
                     ("–" if row.get("headroom") is None else f'{row["headroom"] * 100:.0f} %', row.get("headroom") or 0),
                     ("–" if row.get("utilisation") is None else f'{row["utilisation"] * 100:.0f} %',
                      row.get("utilisation") or 0), _sure_cell(row), row.get("layout", "")])
    about = plan.get("replications")
    sure = f'carried in (of {about["count"]}); {about["confidence"] * 100:.0f} % interval' if about else "how sure"
    table = _table(["growth", "GPUs", "offered (req/s)", "headroom", "load / capacity", sure, "configuration per GPU"],
                   rows, "plan-table")
    note = f'<p class="note">{escape(plan.get("hardware_note", ""))}</p>' if plan.get("hardware_note") else ""
    return f'<section id="plan"><h2>Capacity plan</h2>{note}{table}</section>'


def _sure_cell(row: dict) -> tuple[str, float]:
    """How sure a planned row's GPU count is: the share of the replications its GPUs carry the load in, and the GPUs
    its capacity interval's ends need; – where the plan has no intervals."""
    if row.get("sufficient_share") is None:
        return "–", 0
    low, high = (n if n is not None else "∞" for n in row["gpus_interval"])
    beyond = " (extrapolated)" if row.get("extrapolated") else ""
    return f'{row["sufficient_share"] * 100:.0f} %; {low} – {high} GPUs{beyond}', row["sufficient_share"]


def _variant_mark(block: dict, candidate: dict, batch: int) -> str:
    """◀ pick on the picked variant's row at the pick's batch size; its other rows and the dropped ones named."""
    if not candidate["picked"]:
        return "" if candidate.get("searched", True) else "dropped (dominated)"
    if batch != block.get("pick_batch"):
        return "picked variant"
    instances = block.get("pick_instances")
    return "◀ pick" + (f" ({instances} instance{'s' if instances != 1 else ''})" if instances else "")


def _variant_rows(block: dict) -> list[list]:
    rows = []
    for c in block["candidates"]:
        for b in c["batches"]:
            energy, memory = b.get("energy_per_request"), b["memory_bytes"]
            rows.append([c["entry"], c["variant"], (c.get("threads") or "–", c.get("threads") or 0),
                         (b["batch"], b["batch"]), (_ms(b["latency_s"]), b["latency_s"]),
                         (_ms(b["p99_s"]), b["p99_s"]), (_num(b["throughput_rps"]), b["throughput_rps"] or 0),
                         ("–" if memory is None else f"{memory / 1e6:,.0f}", memory or 0),
                         ("–" if energy is None else f'{energy:.3g} {b["energy_unit"]}', energy or 0),
                         _variant_mark(block, c, b["batch"])])
    return rows


def _energy_note(block: dict) -> str:
    measures = sorted({b["energy_measure"] for c in block["candidates"] for b in c["batches"]
                       if b.get("energy_measure")})
    if not measures:
        return ""
    proxy = (" — not energy: the CPU-seconds of the server and its instances per request, a proxy, as this host "
             "exposes no energy counter") if "cpu_seconds_proxy" in measures else ""
    return f'<p class="note">Energy per request measured as {escape(", ".join(measures))}{proxy}.</p>'


def variants_section(data: dict) -> str:
    """The study's comparison per model (``tune --variants``): each candidate variant x measured batch size ->
    latency, throughput, memory per instance and energy per request (or the CPU-seconds proxy, named as such), as
    the profile measured them; the pick's row marked."""
    variants = (data.get("tune") or {}).get("variants") or {}
    parts = []
    for slot, block in sorted(variants.items()):
        parts.append(f"<h3>{escape(slot)} (on {escape(block['device'])}; pick: {escape(str(block['pick']))})</h3>"
                     + _table(["entry", "variant", "threads", "batch", "latency mean (ms)", "p99 (ms)",
                               "throughput (rows/s)", "memory per instance (MB)", "energy per request", ""],
                              _variant_rows(block), f"variants-{slot}")
                     + _energy_note(block))
    if not parts:
        return ""
    note = ('<p class="note">Each model\'s measured variants, one instance alone, at the threads per instance each '
            'was measured at (from the profile); throughput = batch / mean latency; ◀ pick: the chosen variant at '
            'the largest measured batch size within its max_batch_size.</p>')
    return f'<section id="variants"><h2>Variants per model</h2>{note}{"".join(parts)}</section>'


def render(data: dict, title: str = "serving-bench report") -> str:
    """The whole page."""
    payload = json.dumps(data, sort_keys=True, allow_nan=False).replace("</", "<\\/")
    parts = [recommendation_section(data), variants_section(data), capacity_section(data), plan_section(data),
             cdf_section(data),
             curves_section(data), telemetry_section(data), heatmap_section(data), validation_section(data),
             top_section(data)]
    return ("<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'; "
            "script-src 'unsafe-inline'; img-src data:\">"
            f"<meta name=\"viewport\" content=\"width=device-width,initial-scale=1\"><title>{escape(title)}</title>"
            f"<style>{CSS}</style></head><body><h1>{escape(title)}</h1>"
            f'<p class="note">Results folder: {escape(str(data.get("root", "")))}. '
            f'<span id="js-status">static</span></p>'
            + "".join(parts) +
            f'<script type="application/json" id="report-data">{payload}</script>'
            f"<script>{SCRIPT}</script></body></html>")
