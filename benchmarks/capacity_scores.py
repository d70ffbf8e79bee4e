"""The scores of ``capacity_fidelity.py`` over its rows (one per configuration): capacity errors, Kendall's tau and
regret of each side (the full model, the baseline), the coverage and width of the full model's capacity intervals,
the targets of issue 44, the printed table and the last line.

A row is a mapping: ``name``, ``group`` (``grid``, ``mix``, ``ensemble``, ``resnet50``), ``held_out`` (why, or
""), ``measured`` and each side's figures: ``rps`` (req/s, interpolated), ``rung_rps`` (the highest rung that met),
``capped``, ``spread`` (the repeats' range over the capacity), a side's ``error`` (predicted / measured - 1) and the
full model's ``interval`` (:func:`interval_figures`, None where none was computed).
"""

from __future__ import annotations

import math
import os
import statistics

import numpy as np
from scipy.stats import kendalltau

TARGETS = {"median": 0.05, "worst": 0.15, "tau": 0.8, "regret": 0.05, "coverage": 0.85, "width": 1.5}
SIDES = ("full", "baseline")


def ranking(rows: list[dict], side: str) -> dict:
    """Kendall's tau (tau-b) between ``side``'s predicted and the measured capacities, and the regret of ``side``'s
    pick: 1 - measured capacity of its first / the measured best; where several tie first (capped at the ladder's
    top, say), the mean of their measured capacities (a user takes any of them). None with fewer than two rows."""
    if len(rows) < 2 or max(r["measured"]["rps"] for r in rows) <= 0:
        return {"tau": None, "regret": None}
    predicted = [r[side]["rps"] for r in rows]
    measured = [r["measured"]["rps"] for r in rows]
    tau = kendalltau(predicted, measured).statistic
    picks = [i for i, p in enumerate(predicted) if p == max(predicted)]  # tied firsts: a user takes any of them
    return {"tau": None if np.isnan(tau) else float(tau),
            "regret": 1 - statistics.mean(measured[i] for i in picks) / max(measured),
            "pick": " = ".join(rows[i]["name"] for i in picks), "best": rows[int(np.argmax(measured))]["name"]}


def errors(rows: list[dict], side: str) -> dict:
    """Median and worst |error| of ``side`` over ``rows`` (those with a measured capacity)."""
    values = [abs(r[side]["error"]) for r in rows if r[side]["error"] is not None]
    return {"median": statistics.median(values), "worst": max(values), "rows": len(values)} if values else \
        {"median": None, "worst": None, "rows": 0}


def interval_figures(low_rps: float | None, high_rps: float, measured: dict) -> dict:
    """A capacity interval (req/s) against the measurement: ``low_rps`` .. ``high_rps`` (``low_rps`` None: no
    interval, fewer than half the replications found a capacity; ``high_rps`` inf: open above, a replication met the
    SLOs at the ladder's top). ``covered``: the measured capacity (interpolated) lies inside; ``half_width``: half the
    width over the middle (None where open above)."""
    if low_rps is None:
        return {"low_rps": None, "high_rps": None, "open_above": False, "covered": False, "half_width": None}
    value, total = measured["rps"], low_rps + high_rps
    covered = low_rps * (1 - 1e-9) <= value <= high_rps * (1 + 1e-9)
    closed = math.isfinite(high_rps)
    return {"low_rps": low_rps, "high_rps": high_rps if closed else None, "open_above": not closed,
            "covered": bool(covered), "half_width": (high_rps - low_rps) / total if closed and total > 0 else None}


def coverage(rows: list[dict]) -> dict:
    """Over the rows whose full model carries an interval: the share covered, the median half-width and the median
    repeat spread of the measurement (the width's yardstick); ``rows`` 0 where no row has one."""
    inside = [r for r in rows if r["full"].get("interval") is not None]
    if not inside:
        return {"rows": 0, "covered": 0, "coverage": None, "half_width": None, "spread": None}
    widths = [math.inf if r["full"]["interval"]["open_above"] else r["full"]["interval"]["half_width"]
              for r in inside if r["full"]["interval"]["low_rps"] is not None]  # open above: as wide as can be
    spreads = [r["measured"]["spread"] for r in inside if r["measured"].get("spread") is not None]
    covered = sum(r["full"]["interval"]["covered"] for r in inside)
    beyond = [r["full"]["interval"] for r in inside if r["full"]["interval"].get("extrapolated")]
    return {"rows": len(inside), "covered": covered, "coverage": covered / len(inside),
            "half_width": statistics.median(widths) if widths else None,
            "spread": statistics.median(spreads) if spreads else None,
            "extrapolated": len(beyond), "extrapolated_covered": sum(i["covered"] for i in beyond)}


def scores(rows: list[dict]) -> dict:
    """Per side: capacity errors over all rows and the held-out ones; tau and regret over all rows and the grid's;
    the full model's interval coverage."""
    grid = [r for r in rows if r["group"] == "grid"]
    held = [r for r in rows if r["held_out"]]
    found = {side: {"errors": errors(rows, side), "held_out_errors": errors(held, side),
                    "ranking": ranking(rows, side), "grid_ranking": ranking(grid, side)} for side in SIDES}
    found["full"]["intervals"] = coverage(rows)
    return found


def pct(value: float | None, signed: bool = False) -> str:
    if value is None:
        return "n/a"
    return f"{value * 100:+.1f} %" if signed else f"{value * 100:.1f} %"


def print_rows(rows: list[dict], growth: str) -> None:
    """The table: per configuration, measured capacity (rung) and repeat spread, each side's prediction and error;
    the full model's interval and whether the measured capacity is inside, where the rows carry one."""
    intervals = any(r["full"].get("interval") is not None for r in rows)
    print(f"\n== capacity (req/s at the SLO, interpolated; the rung in brackets; growth {growth})")
    print(f"  {'configuration':<24} {'held out':<8} {'measured':>17} {'spread':>8} | {'full':>7} {'error':>8}"
          + (f"  {'interval':>21}" if intervals else "") + f" | {'baseline':>8} {'error':>8}")
    for r in rows:
        m, full, base = r["measured"], r["full"], r["baseline"]
        interval = f"  {interval_text(full.get('interval')):>21}" if intervals else ""
        print(f"  {r['name']:<24} {'yes' if r['held_out'] else '-':<8} {at_least(m)}{m['rps']:>7.1f} "
              f"({m['rung_rps']:>6.1f}) {pct(m['spread']):>8} | {at_least(full)}{full['rps']:>6.1f} "
              f"{pct(full['error'], True):>8}{interval} | {at_least(base)}{base['rps']:>7.1f} "
              f"{pct(base['error'], True):>8}" + ("" if m["how"] == "interpolated" else f"  ({m['how']})"))
    print("  (>= : capped, met at the ladder's top; an error from it is a lower bound of the error's size)")
    if any((r["full"].get("interval") or {}).get("extrapolated") for r in rows):
        print("  (* : the interval reaches above the busiest load the profile measured, and its low end is lowered "
              "to that load: tune.intervals)")


def at_least(side: dict) -> str:
    return ">=" if side["capped"] else "  "


def interval_text(interval: dict | None) -> str:
    """``low..high in`` (or ``out``: the measured rung outside); ``n/a`` without one."""
    if interval is None or interval["low_rps"] is None:
        return "n/a"
    high = "" if interval["open_above"] else f"{interval['high_rps']:.1f}"
    beyond = "*" if interval.get("extrapolated") else ""
    return f"{interval['low_rps']:.1f}..{high}{beyond} {'in' if interval['covered'] else 'out'}"


def print_scores(rows: list[dict], found: dict) -> None:
    others = [r["other_tenants_cores"] for r in rows if r["other_tenants_cores"] is not None]
    if others:
        print(f"\nother tenants kept the machine busy during the replays: median {statistics.median(others):.2f} cores "
              f"(worst configuration {max(others):.2f}) of {os.cpu_count()}; a quiet machine has near 0")
    spreads = [r["measured"]["spread"] for r in rows if r["measured"]["spread"] is not None]
    if spreads:
        print(f"\nrepeat spread of the measured capacity (what one measurement resolves): median "
              f"{pct(statistics.median(spreads))}, worst {pct(max(spreads))} over {len(spreads)} configurations")
    for side in SIDES:
        s = found[side]
        every, held = s["errors"], s["held_out_errors"]
        print(f"{side}: capacity error median {pct(every['median'])}, worst {pct(every['worst'])} over "
              f"{every['rows']} configurations; held out ({held['rows']}): median {pct(held['median'])}, worst "
              f"{pct(held['worst'])}")
        for label, rank in (("all configurations", s["ranking"]), ("the grid", s["grid_ranking"])):
            if rank["tau"] is not None:
                print(f"  over {label}: tau {rank['tau']:.2f}, regret {pct(rank['regret'])} (picks {rank['pick']}; "
                      f"measured best {rank['best']})")
    cover = found["full"]["intervals"]
    if cover["rows"]:
        print(f"full model's capacity intervals: coverage {cover['covered']}/{cover['rows']} ({pct(cover['coverage'])}"
              f"; target >= {pct(TARGETS['coverage'])}), median half-width {pct(cover['half_width'])} against the "
              f"measurement's median repeat spread {pct(cover['spread'])} (target: at most "
              f"{TARGETS['width']:g} times it)")
        if cover.get("extrapolated"):
            print(f"  {cover['extrapolated']} of them reach above the profile's busiest run and run down to it "
                  f"(marked *): {cover['extrapolated_covered']} covered")


def verdicts(found: dict) -> dict[str, bool]:
    """Each target of issue 44 met or not by the full model (and at least as good as the baseline); the intervals'
    coverage and width where rows carry intervals."""
    full, base = found["full"], found["baseline"]
    figures_ = {"median": (full["errors"]["median"], base["errors"]["median"]),
                "worst": (full["errors"]["worst"], base["errors"]["worst"]),
                "regret": (full["grid_ranking"]["regret"], base["grid_ranking"]["regret"])}
    out = {k: f is not None and f <= TARGETS[k] and (b is None or f <= b) for k, (f, b) in figures_.items()}
    tau, tau_base = full["grid_ranking"]["tau"], base["grid_ranking"]["tau"]
    out["tau"] = tau is not None and tau >= TARGETS["tau"] and (tau_base is None or tau >= tau_base)
    cover = full["intervals"]
    if cover["rows"]:
        out["coverage"] = cover["coverage"] >= TARGETS["coverage"]
        out["width"] = (cover["half_width"] is not None and cover["spread"] is not None
                        and cover["half_width"] <= TARGETS["width"] * cover["spread"])
    return out


def last_line(found: dict) -> str:
    """The benchmark's last line: capacity errors over every row, tau and regret within the grid, both sides."""
    def number(value: float | None, scale: float = 100.0, digits: int = 1) -> str:
        return "n/a" if value is None else f"{value * scale:.{digits}f}"

    def part(side: str) -> tuple[str, str, str, str]:
        s = found[side]
        return (number(s["errors"]["median"]), number(s["errors"]["worst"]),
                number(s["grid_ranking"]["tau"], 1.0, 2), number(s["grid_ranking"]["regret"]))
    a, b, c, d = part("full")
    a_, b_, c_, d_ = part("baseline")
    return (f"capacity error: median {a} %, worst {b} %; ranking tau {c}; regret {d} % (baseline: median {a_} %, "
            f"worst {b_} %, tau {c_}, regret {d_} %)")
