"""The parts every benchmark against a peer shares: trials run interleaved, each side's figures as a median with its
range, plausibility, the ratio line printed last, and where results go
(``benchmarks/results/<name>[_quick]_<date>_<host>.json`` with the machine facts).

    runs = interleave(3, {"serving_bench": ours_trial, "perf_analyzer": peer_trial})
    cmp = compare([figure(r["rate"], floor=...) for r in runs["serving_bench"]], [figure(...) ...])
    print(ratio_line("max sustained open-loop rate", cmp, unit="req/s", target=">= 1.0"))

A ratio is computed per trial (the two sides of one trial ran back to back, so they saw the same machine) from
figures that are both *plausible*; the median of those ratios is the headline and min..max its range. A figure
outside the band its benchmark can justify (below a rate the same side sustained earlier in the run, above what the
server can physically do) is reported as unreliable, with the reason, and yields no ratio.
"""

from __future__ import annotations

import datetime as dt
import math
import os
import platform
import socket
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from serving_bench.files import atomic_write_json, atomic_write_text
from serving_bench.peers.perf_analyzer import Unstable
from serving_bench.telemetry.cpu import StealClock

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
_LOAD_AT_START = os.getloadavg()[0]  # benchmarks import this module first thing: the machine before they ran
_STEAL = StealClock()  # the hypervisor's steal since the start


def machine() -> dict:
    """Facts that make a figure comparable: date, host, CPU model and count, load average at the start (when this
    module was imported) and at the end (the benchmark's own load included), Python, and the hypervisor's steal
    since the start (CPU seconds and their share of the machine's CPU time)."""
    cpu = ""
    try:
        cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                    if line.startswith("model name")), "")
    except OSError:
        pass
    return {"date": dt.date.today().isoformat(), "host": socket.gethostname() or platform.node(), "cpu": cpu,
            "cpus": os.cpu_count(), "load_average_1m": _LOAD_AT_START, "load_average_1m_at_end": os.getloadavg()[0],
            "python": platform.python_version(), "steal_s": round(_STEAL.seconds(), 2),
            "steal_share": round(_STEAL.share(), 4)}


def result_stem(path: Path) -> str:
    """A result file's name without ``.json.xz`` or ``.json``."""
    for ending in (".json.xz", ".json"):
        if path.name.endswith(ending):
            return path.name[: -len(ending)]
    return path.stem


def write_result(name: str, data: dict, *, quick: bool, out_dir: str | Path | None = None,
                 markdown: str | None = None, timed: bool = True, same_suffix_as: Path | None = None,
                 compressed: bool = False) -> Path:
    """Write ``data`` (plus :func:`machine`) as JSON, and ``markdown`` beside it as ``.md`` if given; returns the
    JSON path: ``NAME[_quick]_DATE_HOST.json``, or ``..._2.json``, ``_3``, ... when an earlier run of the day has it
    (a committed result is never overwritten); with ``compressed``, ``.json.xz`` (saved measurements: megabytes of
    JSON, a fifth of it compressed; ``files.read_json`` reads either). ``same_suffix_as``: a file this run wrote under
    another name (its measurements, say); this one takes its suffix where that is free, so the pair's names agree. A
    run on a disturbed machine (hypervisor steal above ``telemetry.cpu.DISTURBED_SHARE``) is said so on stdout,
    unless nothing in it was timed (``timed=False``: figures computed from saved measurements, whose own files record
    their steal)."""
    facts = machine()
    out_dir = Path(out_dir) if out_dir else RESULTS
    out_dir.mkdir(parents=True, exist_ok=True)
    day_host = f"_{facts['date']}_{facts['host']}"
    stem = f"{name}{'_quick' if quick else ''}{day_host}"
    ending = ".json.xz" if compressed else ".json"
    path, n = out_dir / f"{stem}{ending}", 2
    if same_suffix_as is not None:
        head, found, suffix = result_stem(Path(same_suffix_as)).rpartition(day_host)
        if found and head and (suffix == "" or (suffix[:1] == "_" and suffix[1:].isdigit())):
            path = out_dir / f"{stem}{suffix}{ending}"
    while path.exists():
        path, n = out_dir / f"{stem}_{n}{ending}", n + 1
    atomic_write_json(path, {**facts, **data}, sort_keys=False)
    if timed and _STEAL.disturbed:
        print(f"warning: the hypervisor took {facts['steal_share']:.1%} of this machine's CPU time during the run "
              f"({facts['steal_s']:.0f} s): figures measured in it are not comparable ({path.name})")
    if markdown is not None:
        atomic_write_text(path.with_name(result_stem(path) + ".md"),
                          markdown if markdown.endswith("\n") else markdown + "\n")
    return path


# -- trials ----------------------------------------------------------------------------------------------------------

def interleave(trials: int, sides: Mapping[str, Callable[[int], Any]],
               log: Callable[[str], None] = print) -> dict[str, list]:
    """Run every side once per trial (``sides[name](trial)``, trial from 0), the order reversed on alternate trials
    (A B, B A, A B, ...), so that a machine that drifts weighs on both sides alike. A peer that finds no stable
    measurement (:class:`~serving_bench.peers.perf_analyzer.Unstable`) leaves ``{"unstable": message}`` for that
    trial and the run goes on. Returns each side's results in trial order."""
    names = list(sides)
    out: dict[str, list] = {name: [None] * trials for name in names}
    for k in range(trials):
        for name in names if k % 2 == 0 else names[::-1]:
            try:
                out[name][k] = sides[name](k)
            except Unstable as err:
                log(f"  trial {k + 1}, {name}: unstable ({err})")
                out[name][k] = {"unstable": str(err)}
    return out


@dataclass(frozen=True)
class Figure:
    """One side's figure in one trial; ``unreliable`` says why it is not compared (None: it is)."""

    value: float | None
    unreliable: str | None = None

    @property
    def usable(self) -> bool:
        return self.unreliable is None and self.value is not None


def figure(value: float | None, *, floor: float | None = None, ceiling: float | None = None, why_floor: str = "",
           why_ceiling: str = "", missing: str = "no figure") -> Figure:
    """``value`` judged against a plausible band: below ``floor`` or above ``ceiling`` it is unreliable, the reason
    naming the bound and ``why_floor``/``why_ceiling`` (where the bound comes from); ``None`` or not finite: no
    figure, for the reason ``missing``."""
    if value is None or not math.isfinite(value):
        return Figure(None, missing)
    if floor is not None and value < floor:
        return Figure(value, f"{value:.4g} is below {floor:.4g}{why_floor}")
    if ceiling is not None and value > ceiling:
        return Figure(value, f"{value:.4g} is above {ceiling:.4g}{why_ceiling}")
    return Figure(value)


@dataclass(frozen=True)
class Spread:
    """Median and range (min..max) of ``n`` figures; all None when there are none."""

    median: float | None
    low: float | None
    high: float | None
    n: int

    @classmethod
    def of(cls, values: Sequence[float]) -> "Spread":
        values = [float(v) for v in values]
        if not values:
            return cls(None, None, None, 0)
        return cls(statistics.median(values), min(values), max(values), len(values))

    def text(self, digits: int = 0) -> str:
        """``"2312 (2250..2375)"``; ``"none"`` without figures."""
        if self.median is None:
            return "none"
        f = f"{{:.{digits}f}}"
        return f"{f.format(self.median)} ({f.format(self.low)}..{f.format(self.high)})"


def compare(ours: Sequence[Figure], peer: Sequence[Figure]) -> dict:
    """Trial-paired comparison: each side's usable figures as a :class:`Spread`, the ratio ours/peer of every trial
    where both are usable, and the reasons for the rest. JSON-ready."""
    if len(ours) != len(peer):
        raise ValueError(f"{len(ours)} trials of ours against {len(peer)} of the peer")
    per_trial, ratios, left_out = [], [], []
    for k, (a, b) in enumerate(zip(ours, peer)):
        ratio = a.value / b.value if a.usable and b.usable and b.value else None
        if ratio is None:
            for side, f in (("ours", a), ("peer", b)):
                if not f.usable:
                    left_out.append({"trial": k + 1, "side": side, "value": f.value, "reason": f.unreliable})
        else:
            ratios.append(ratio)
        per_trial.append({"trial": k + 1, "ours": asdict(a), "peer": asdict(b), "ratio": ratio})
    return {"trials": len(ours), "ours": asdict(Spread.of([f.value for f in ours if f.usable])),
            "peer": asdict(Spread.of([f.value for f in peer if f.usable])), "ratio": asdict(Spread.of(ratios)),
            "per_trial": per_trial, "unreliable": left_out}


def ratio_line(what: str, cmp: dict, *, unit: str, target: str, ours: str = "serving-bench",
               peer: str = "perf_analyzer", digits: int = 0) -> str:
    """The line a peer benchmark prints last: both sides' medians (ranges) over the trials and the ratio's, or why
    there is no ratio."""
    a, b, r = (Spread(**cmp[k]) for k in ("ours", "peer", "ratio"))
    head = (f"{what}, median (min..max) over {cmp['trials']} trials: {ours} {a.text(digits)} vs {peer} "
            f"{b.text(digits)} {unit}")
    sides = {"ours": ours, "peer": peer}
    notes = "; ".join(f"trial {u['trial']} {sides[u['side']]}: {u['reason']}" for u in cmp["unreliable"])
    if r.median is None:
        return f"{head} -> ratio: none, unreliable ({notes or 'no trials'}); target {target}"
    left = f"; left out as unreliable: {notes}" if notes else ""
    return f"{head} -> ratio {r.text(3)} from {r.n} trials (target {target}){left}"
