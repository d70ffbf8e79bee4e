"""Inline SVG charts, written as strings (no plotting library, nothing fetched by the page).

Each function returns one ``<svg class="chart">`` element; every data point carries a ``<title>`` so hovering shows
its values. Series are down-sampled to at most ``max_points`` points (evenly by index, keeping both ends).
"""

from __future__ import annotations

import math
from html import escape
from typing import Sequence

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f",
           "#bcbd22")
WIDTH, HEIGHT = 640, 320
MARGIN = dict(left=64, right=16, top=24, bottom=48)


def _fmt(v: float) -> str:
    if v == 0 or not math.isfinite(v):
        return "0" if v == 0 else str(v)
    a = abs(v)
    if a >= 1000:
        return f"{v:,.0f}"
    if a >= 10:
        return f"{v:.0f}"
    if a >= 1:
        return f"{v:.1f}"
    return f"{v:.3g}"


def nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """About ``n`` round tick values covering [lo, hi]."""
    if hi <= lo:
        hi = lo + 1.0
    raw = (hi - lo) / max(n, 1)
    mag = 10 ** math.floor(math.log10(raw))
    step = min((m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw), default=raw)
    start = math.floor(lo / step) * step
    ticks = []
    v = start
    while v <= hi + step * 1e-9:
        if v >= lo - step * 1e-9:
            ticks.append(round(v, 12))
        v += step
    return ticks


def _downsample(xs: Sequence[float], ys: Sequence[float], max_points: int) -> tuple[list[float], list[float]]:
    n = len(xs)
    if n <= max_points:
        return list(xs), list(ys)
    idx = sorted({round(i * (n - 1) / (max_points - 1)) for i in range(max_points)})
    return [xs[i] for i in idx], [ys[i] for i in idx]


def line_chart(series: Sequence[tuple[str, Sequence[float], Sequence[float]]], *, title: str, x_label: str,
               y_label: str, chart_id: str, log_x: bool = False, markers: bool = True, step: bool = False,
               hlines: Sequence[tuple[str, float]] = (), max_points: int = 400, y_max: float | None = None) -> str:
    """Lines (one per ``(label, xs, ys)``), optional horizontal reference lines ``(label, y)`` (e.g. an SLO).
    With ``y_max``, larger values are drawn at the top edge (their tooltips keep the true value)."""
    clean = []
    for label, xs, ys in series:
        pts = [(float(x), float(y)) for x, y in zip(xs, ys)
               if x is not None and y is not None and math.isfinite(x) and math.isfinite(y) and (not log_x or x > 0)]
        if pts:
            px, py = _downsample([p[0] for p in pts], [p[1] for p in pts], max_points)
            clean.append((label, px, py))
    if not clean:
        return f'<p class="empty" id="{escape(chart_id)}">{escape(title)}: no data</p>'
    all_x = [x for _, xs, _ in clean for x in xs]
    all_y = [y for _, _, ys in clean for y in ys] + [y for _, y in hlines]
    fx = (lambda v: math.log10(v)) if log_x else (lambda v: v)
    x_lo, x_hi = fx(min(all_x)), fx(max(all_x))
    if x_hi <= x_lo:
        x_hi = x_lo + 1.0
    y_lo, y_hi = min(0.0, min(all_y)), max(all_y) * 1.05 or 1.0
    if y_max is not None and y_hi > y_max:
        y_hi = y_max
    pw, ph = WIDTH - MARGIN["left"] - MARGIN["right"], HEIGHT - MARGIN["top"] - MARGIN["bottom"]

    def sx(v):
        return MARGIN["left"] + (fx(v) - x_lo) / (x_hi - x_lo) * pw

    def sy(v):
        return MARGIN["top"] + ph - (min(v, y_hi) - y_lo) / (y_hi - y_lo) * ph

    out = [f'<svg class="chart" id="{escape(chart_id)}" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
           f'xmlns="http://www.w3.org/2000/svg"><title>{escape(title)}</title>',
           f'<text x="{WIDTH / 2}" y="16" text-anchor="middle" class="ct">{escape(title)}</text>']
    # axes and ticks
    out.append(f'<g class="axis"><line x1="{MARGIN["left"]}" y1="{MARGIN["top"] + ph}" x2="{MARGIN["left"] + pw}" '
               f'y2="{MARGIN["top"] + ph}"/><line x1="{MARGIN["left"]}" y1="{MARGIN["top"]}" x2="{MARGIN["left"]}" '
               f'y2="{MARGIN["top"] + ph}"/>')
    if log_x:
        xt = [m * 10 ** e for e in range(math.floor(x_lo), math.ceil(x_hi) + 1) for m in (1, 2, 5)
              if x_lo - 1e-9 <= math.log10(m * 10 ** e) <= x_hi + 1e-9]
        xt = xt or [10 ** x_lo, 10 ** x_hi]
    else:
        xt = nice_ticks(x_lo, x_hi)
    for t in xt:
        x = sx(t)
        out.append(f'<line class="grid" x1="{x:.1f}" y1="{MARGIN["top"]}" x2="{x:.1f}" y2="{MARGIN["top"] + ph}"/>'
                   f'<text x="{x:.1f}" y="{MARGIN["top"] + ph + 16}" text-anchor="middle">{_fmt(t)}</text>')
    for t in nice_ticks(y_lo, y_hi):
        y = sy(t)
        out.append(f'<line class="grid" x1="{MARGIN["left"]}" y1="{y:.1f}" x2="{MARGIN["left"] + pw}" y2="{y:.1f}"/>'
                   f'<text x="{MARGIN["left"] - 6}" y="{y + 4:.1f}" text-anchor="end">{_fmt(t)}</text>')
    out.append(f'<text x="{MARGIN["left"] + pw / 2}" y="{HEIGHT - 8}" text-anchor="middle">{escape(x_label)}</text>'
               f'<text transform="translate(14 {MARGIN["top"] + ph / 2}) rotate(-90)" text-anchor="middle">'
               f'{escape(y_label)}</text></g>')
    for label, y in hlines:
        out.append(f'<g class="ref"><line x1="{MARGIN["left"]}" y1="{sy(y):.1f}" x2="{MARGIN["left"] + pw}" '
                   f'y2="{sy(y):.1f}"/><text x="{MARGIN["left"] + pw - 4}" y="{sy(y) - 4:.1f}" text-anchor="end">'
                   f'{escape(label)}</text></g>')
    for i, (label, xs, ys) in enumerate(clean):
        color = PALETTE[i % len(PALETTE)]
        pts = []
        for j, (x, y) in enumerate(zip(xs, ys)):
            if step and j:
                pts.append(f"{sx(x):.1f},{sy(ys[j - 1]):.1f}")
            pts.append(f"{sx(x):.1f},{sy(y):.1f}")
        out.append(f'<g class="series" data-series="{escape(label)}" style="color:{color}">'
                   f'<polyline fill="none" stroke="{color}" stroke-width="1.8" points="{" ".join(pts)}"/>')
        if markers and len(xs) <= 60:
            for x, y in zip(xs, ys):
                out.append(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="3" fill="{color}"><title>'
                           f'{escape(label)}: {escape(x_label)} {_fmt(x)}, {escape(y_label)} {_fmt(y)}</title></circle>')
        out.append("</g>")
    # legend
    lx, ly = MARGIN["left"] + 8, MARGIN["top"] + 8
    for i, (label, _, _) in enumerate(clean):
        color = PALETTE[i % len(PALETTE)]
        out.append(f'<g class="legend-item" data-series="{escape(label)}" tabindex="0">'
                   f'<rect x="{lx}" y="{ly + i * 16}" width="10" height="10" fill="{color}"/>'
                   f'<text x="{lx + 14}" y="{ly + i * 16 + 9}">{escape(label)}</text></g>')
    out.append("</svg>")
    return "".join(out)


def heat_map(rows: Sequence[str], cols: Sequence[str], values: Sequence[Sequence[float | None]], *, title: str,
             chart_id: str, value_label: str, row_label: str = "", col_label: str = "") -> str:
    """A grid of cells coloured by value (white = lowest, dark blue = highest, grey = no value)."""
    cell_w, cell_h, left, top = 64, 26, 180, 40
    width = max(left + cell_w * max(len(cols), 1) + 16, int(len(title) * 7.2) + 20)
    height = top + cell_h * max(len(rows), 1) + 40
    finite = [v for row in values for v in row if v is not None and math.isfinite(v)]
    lo, hi = (min(finite), max(finite)) if finite else (0.0, 1.0)
    out = [f'<svg class="chart heatmap" id="{escape(chart_id)}" viewBox="0 0 {width} {height}" role="img" '
           f'style="max-width:{width}px" '
           f'xmlns="http://www.w3.org/2000/svg"><title>{escape(title)}</title>',
           f'<text x="{width / 2}" y="16" text-anchor="middle" class="ct">{escape(title)}</text>',
           f'<text x="{left + cell_w * len(cols) / 2}" y="32" text-anchor="middle">{escape(col_label)}</text>']
    for j, c in enumerate(cols):
        out.append(f'<text x="{left + j * cell_w + cell_w / 2}" y="{top + cell_h * len(rows) + 16}" '
                   f'text-anchor="middle">{escape(str(c))}</text>')
    for i, r in enumerate(rows):
        out.append(f'<text x="{left - 6}" y="{top + i * cell_h + cell_h / 2 + 4}" text-anchor="end">'
                   f'{escape(str(r))}</text>')
        for j, c in enumerate(cols):
            v = values[i][j]
            if v is None or not math.isfinite(v):
                fill, text = "#dddddd", "–"
            else:
                t = 0.0 if hi == lo else (v - lo) / (hi - lo)
                fill = f"rgb({int(255 - 224 * t)},{int(255 - 180 * t)},{int(255 - 75 * t)})"
                text = _fmt(v)
            ink = "#fff" if v is not None and finite and hi > lo and (v - lo) / (hi - lo) > 0.6 else "#000"
            out.append(f'<g class="cell"><rect x="{left + j * cell_w}" y="{top + i * cell_h}" width="{cell_w - 2}" '
                       f'height="{cell_h - 2}" fill="{fill}"><title>{escape(row_label)} {escape(str(r))}, '
                       f'{escape(col_label)} {escape(str(c))}: {escape(value_label)} {text}</title></rect>'
                       f'<text x="{left + j * cell_w + cell_w / 2 - 1}" y="{top + i * cell_h + cell_h / 2 + 4}" '
                       f'text-anchor="middle" style="fill:{ink}">{text}</text></g>')
    out.append("</svg>")
    return "".join(out)
