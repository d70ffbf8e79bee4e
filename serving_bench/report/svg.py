"""Inline SVG charts, written as strings (no plotting library, nothing fetched by the page).

Each function returns one ``<svg class="chart">`` element; every data point carries a ``<title>`` so hovering shows
its values. Series are down-sampled to at most ``max_points`` points (evenly by index, keeping both ends).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from html import escape
from typing import Callable, Sequence

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


Series = Sequence[tuple[str, Sequence[float], Sequence[float]]]  # (label, xs, ys) per line


@dataclass(frozen=True)
class LineChart:
    """A line chart's settings: its ``title``, axis labels and element id; ``log_x`` (a log-scaled x axis: points at
    x <= 0 are left out); ``markers`` (a circle per point, with its values on hover, for series of at most 60
    points); ``step`` (each value held until the next x); ``hlines`` horizontal reference lines ``(label, y)`` (e.g.
    an SLO); ``max_points`` per series (down-sampled beyond); ``y_max`` (larger values are drawn at the top edge,
    their tooltips keeping the true value)."""

    title: str
    x_label: str
    y_label: str
    chart_id: str
    log_x: bool = False
    markers: bool = True
    step: bool = False
    hlines: Sequence[tuple[str, float]] = ()
    max_points: int = 400
    y_max: float | None = None

    def svg(self, series: Series) -> str:
        """The chart of ``series`` (one line per ``(label, xs, ys)``); a one-line note when no point is finite."""
        clean = self._clean(series)
        if not clean:
            return f'<p class="empty" id="{escape(self.chart_id)}">{escape(self.title)}: no data</p>'
        frame = self._frame(clean)
        out = [f'<svg class="chart" id="{escape(self.chart_id)}" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
               f'xmlns="http://www.w3.org/2000/svg"><title>{escape(self.title)}</title>',
               f'<text x="{WIDTH / 2}" y="16" text-anchor="middle" class="ct">{escape(self.title)}</text>',
               *self._axes(frame)]
        for label, y in self.hlines:
            out.append(f'<g class="ref"><line x1="{MARGIN["left"]}" y1="{frame.sy(y):.1f}" '
                       f'x2="{MARGIN["left"] + frame.pw}" y2="{frame.sy(y):.1f}"/><text x="{MARGIN["left"] + frame.pw - 4}" '
                       f'y="{frame.sy(y) - 4:.1f}" text-anchor="end">{escape(label)}</text></g>')
        for i, line in enumerate(clean):
            out.extend(self._line(frame, PALETTE[i % len(PALETTE)], *line))
        lx, ly = MARGIN["left"] + 8, MARGIN["top"] + 8
        for i, (label, _, _) in enumerate(clean):  # the legend
            out.append(f'<g class="legend-item" data-series="{escape(label)}" tabindex="0">'
                       f'<rect x="{lx}" y="{ly + i * 16}" width="10" height="10" fill="{PALETTE[i % len(PALETTE)]}"/>'
                       f'<text x="{lx + 14}" y="{ly + i * 16 + 9}">{escape(label)}</text></g>')
        out.append("</svg>")
        return "".join(out)

    def _clean(self, series: Series) -> list[tuple[str, list[float], list[float]]]:
        """Each series' finite points (positive x on a log axis), down-sampled; series left empty are dropped."""
        clean = []
        for label, xs, ys in series:
            pts = [(float(x), float(y)) for x, y in zip(xs, ys) if x is not None and y is not None
                   and math.isfinite(x) and math.isfinite(y) and (not self.log_x or x > 0)]
            if pts:
                px, py = _downsample([p[0] for p in pts], [p[1] for p in pts], self.max_points)
                clean.append((label, px, py))
        return clean

    def _frame(self, clean: list[tuple[str, list[float], list[float]]]) -> "_Frame":
        all_x = [x for _, xs, _ in clean for x in xs]
        all_y = [y for _, _, ys in clean for y in ys] + [y for _, y in self.hlines]
        fx = math.log10 if self.log_x else float
        x_lo, x_hi = fx(min(all_x)), fx(max(all_x))
        if x_hi <= x_lo:
            x_hi = x_lo + 1.0
        y_lo, y_hi = min(0.0, min(all_y)), max(all_y) * 1.05 or 1.0
        if self.y_max is not None and y_hi > self.y_max:
            y_hi = self.y_max
        return _Frame(fx, x_lo, x_hi, y_lo, y_hi)

    def _axes(self, frame: "_Frame") -> list[str]:
        """The axes, their ticks and grid lines, and their labels."""
        pw, ph, left, top = frame.pw, frame.ph, MARGIN["left"], MARGIN["top"]
        out = [f'<g class="axis"><line x1="{left}" y1="{top + ph}" x2="{left + pw}" y2="{top + ph}"/>'
               f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + ph}"/>']
        if self.log_x:
            xt = [m * 10 ** e for e in range(math.floor(frame.x_lo), math.ceil(frame.x_hi) + 1) for m in (1, 2, 5)
                  if frame.x_lo - 1e-9 <= math.log10(m * 10 ** e) <= frame.x_hi + 1e-9]
            xt = xt or [10 ** frame.x_lo, 10 ** frame.x_hi]
        else:
            xt = nice_ticks(frame.x_lo, frame.x_hi)
        for t in xt:
            x = frame.sx(t)
            out.append(f'<line class="grid" x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{top + ph}"/>'
                       f'<text x="{x:.1f}" y="{top + ph + 16}" text-anchor="middle">{_fmt(t)}</text>')
        for t in nice_ticks(frame.y_lo, frame.y_hi):
            y = frame.sy(t)
            out.append(f'<line class="grid" x1="{left}" y1="{y:.1f}" x2="{left + pw}" y2="{y:.1f}"/>'
                       f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{_fmt(t)}</text>')
        out.append(f'<text x="{left + pw / 2}" y="{HEIGHT - 8}" text-anchor="middle">{escape(self.x_label)}</text>'
                   f'<text transform="translate(14 {top + ph / 2}) rotate(-90)" text-anchor="middle">'
                   f'{escape(self.y_label)}</text></g>')
        return out

    def _line(self, frame: "_Frame", color: str, label: str, xs: list[float], ys: list[float]) -> list[str]:
        """One series: its polyline (stepped with ``step``) and, for short series, a marker per point."""
        pts = []
        for j, (x, y) in enumerate(zip(xs, ys)):
            if self.step and j:
                pts.append(f"{frame.sx(x):.1f},{frame.sy(ys[j - 1]):.1f}")
            pts.append(f"{frame.sx(x):.1f},{frame.sy(y):.1f}")
        out = [f'<g class="series" data-series="{escape(label)}" style="color:{color}">'
               f'<polyline fill="none" stroke="{color}" stroke-width="1.8" points="{" ".join(pts)}"/>']
        if self.markers and len(xs) <= 60:
            for x, y in zip(xs, ys):
                out.append(f'<circle cx="{frame.sx(x):.1f}" cy="{frame.sy(y):.1f}" r="3" fill="{color}"><title>'
                           f'{escape(label)}: {escape(self.x_label)} {_fmt(x)}, {escape(self.y_label)} {_fmt(y)}'
                           f'</title></circle>')
        out.append("</g>")
        return out


@dataclass(frozen=True)
class _Frame:
    """The plot area's data ranges (x after ``fx``, the log for a log axis) and the scales into it."""

    fx: Callable[[float], float]
    x_lo: float
    x_hi: float
    y_lo: float
    y_hi: float
    pw: float = WIDTH - MARGIN["left"] - MARGIN["right"]
    ph: float = HEIGHT - MARGIN["top"] - MARGIN["bottom"]

    def sx(self, v: float) -> float:
        return MARGIN["left"] + (self.fx(v) - self.x_lo) / (self.x_hi - self.x_lo) * self.pw

    def sy(self, v: float) -> float:
        return MARGIN["top"] + self.ph - (min(v, self.y_hi) - self.y_lo) / (self.y_hi - self.y_lo) * self.ph


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
