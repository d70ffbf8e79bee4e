"""Top-K verification: the same schedule replayed on real Triton with each candidate's configuration.

Embedded (default): the repository is copied (artifacts hard-linked, so nothing large is duplicated), the candidate
is written into the copy's ``config.pbtxt`` s with :meth:`ServingConfig.apply_to_repo`, and a real tritonserver serves
the copy on loopback. External (``--url``): each model is reloaded on that server with the candidate's settings
(Triton's explicit model control: ``load_model`` with a config override), which needs a server started with
``--model-control-mode=explicit``. The measured and the simulated summaries sit side by side.

What is replayed (:func:`capacity_replays`): the load as given (1x), the candidate's predicted capacity and one ladder
rung above it, each the load grown by its growth rule (``Load.at``), so the replays bracket the capacity on Triton as
the bisection did on the simulator (:func:`measured_bracket`). A capacity capped at the top of the search is replayed
there only (nothing above was searched); a candidate that misses the SLOs at 1x, at 1x only. Where the candidate
has a capacity interval and the replays disagree with the prediction, one more replay checks the interval
(:func:`interval_replay`): at its low end when the SLOs were missed at the predicted capacity, one rung above its high
end when they held one rung above the capacity. The replays of a candidate run on one server, one after the other,
each as long as the load.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence

from serving_bench.errors import ServerError
from serving_bench.export.repository import list_entries
from serving_bench.files import publish_folder
from serving_bench.load.uncancelled import cut_after_s, replay_or_cut
from serving_bench.run.results import write_results
from serving_bench.run.schedule import Schedule
from serving_bench.serve.control import Control
from serving_bench.serve.server import MAX_RESTARTS, connect
from serving_bench.serving_config import ServingConfig, apply_model_serving
from serving_bench.tune import adapters
from serving_bench.tune.capacity import Ladder
from serving_bench.tune.variants import renamed_schedule, summary_for_slots


def copy_repo(repo: str | Path, dest: str | Path, models: list[str] | None = None) -> Path:
    """Copy ``repo`` (or the named entries) to ``dest``; files are hard-linked where possible, configs rewritten
    later by rename, so the original is never modified."""
    repo, dest = Path(repo), Path(dest)
    dest.mkdir(parents=True, exist_ok=True)

    def link(src, dst):
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)

    for name in models or list_entries(repo):
        shutil.copytree(repo / name, dest / name, copy_function=link, symlinks=True)
    for extra in ("manifest.json",):
        if (repo / extra).is_file():
            shutil.copy2(repo / extra, dest / extra)
    return dest


def served_entries(base: ServingConfig, chosen: Mapping[str, str]) -> list[str]:
    """The entries a tuned repository with variants holds: each served model's chosen entry (itself where none
    was chosen) and the ensembles; not the variants left unchosen (Triton would load them all)."""
    return [chosen.get(m, m) for m in base.names] + [e for e, _ in base.ensembles]


def write_tuned_repo(repo: str | Path, config: ServingConfig, dest: str | Path,
                     entries: list[str] | None = None) -> Path:
    """A copy of ``repo`` (of its ``entries`` where given) with ``config`` applied, written to a temporary folder and
    renamed to ``dest``."""
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}-"))
    try:
        copy_repo(repo, tmp / "repo", entries)
        config.apply_to_repo(tmp / "repo")
        publish_folder(tmp / "repo", dest, replace=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def apply_to_server(url: str, config: ServingConfig) -> None:
    """Reload each model of ``config`` on the external server at gRPC ``url`` with its settings."""
    with Control(url) as control:
        for model in config.models:
            try:
                control.load_model(model.name, apply_model_serving(control.model_config(model.name), model))
            except ServerError as err:
                raise ServerError(f"could not reload {model.name} on {url} with the candidate settings ({err}); "
                                  "the server must run with --model-control-mode=explicit") from None


@dataclass(frozen=True)
class Replay:
    """One replay of a candidate: ``label`` (``load``: 1x; ``capacity``: the predicted capacity, capped or not;
    ``above``: one rung above it) at load ``scale``."""

    label: str
    scale: float

    @property
    def folder(self) -> str:
        return f"{self.label}-{self.scale:.2f}x"


def capacity_replays(result: dict, ladder: Ladder) -> tuple[Replay, ...]:
    """The replays that check a candidate's simulated ``result`` (``capacity_scale``, ``capacity_capped``), by scale
    (module doc); a capacity of 1x is one replay, labelled ``capacity``."""
    capacity = result["capacity_scale"]
    if capacity <= 0:
        return (Replay("load", 1.0),)
    at = [Replay("capacity", capacity)]
    if not result["capacity_capped"]:
        at.append(Replay("above", ladder.above(capacity)))
    if all(abs(r.scale - 1.0) > 1e-9 for r in at):
        at.append(Replay("load", 1.0))
    return tuple(sorted(at, key=lambda r: r.scale))


def measured_bracket(outcomes: Sequence[tuple[float, bool]]) -> tuple[float | None, float | None]:
    """From ``(scale, SLOs met)`` replays: (the highest scale that met below the lowest that failed, the lowest that
    failed); None where no replay says."""
    failed = min((s for s, ok in outcomes if not ok), default=None)
    met = max((s for s, ok in outcomes if ok and (failed is None or s < failed)), default=None)
    return met, failed


def interval_replay(result: dict, outcomes: Sequence[tuple[Replay, bool]], ladder: Ladder) -> Replay | None:
    """The replay that checks a candidate's capacity interval (``result["capacity_interval"]``, load scales of
    ``ladder``'s search) after the replays ``(replay, SLOs met)`` disagreed with its prediction: at the interval's low end where
    the SLOs were missed at the predicted capacity, one rung above its high end where they held one rung above the
    capacity (not above the top of the search); None where the interval is missing, the replays agree, or they
    already place the measured capacity against the interval."""
    interval = result.get("capacity_interval") or {}
    low, high = interval.get("low_scale"), interval.get("high_scale")
    if low is None or high is None:
        return None
    verdict = {r.label: ok for r, ok in outcomes}
    met, failed = measured_bracket([(r.scale, ok) for r, ok in outcomes])
    if verdict.get("capacity") is False and 0 < low < failed and (met is None or met < low):
        return Replay("interval-low", low)
    top = ladder.above(high)
    if verdict.get("above") and top <= ladder.scale(ladder.i_max) and met < top and (failed is None or top < failed):
        return Replay("interval-high", top)
    return None


def interval_holds(low: float, high: float, met: float | None, failed: float | None, ladder: Ladder) -> bool | None:
    """Whether the measured capacity, the highest scale in ``[met, failed)`` at which the SLOs hold (``met`` None: 0,
    the SLOs missed at every scale replayed; ``failed`` None: unbounded), lies inside the interval ``[low, high]`` (a
    low end of 0: some replications missed at 1x) at ``ladder``'s resolution (missed one rung above ``high``: at most
    ``high``): True where the bracket is inside it, False where it is outside, None where the replays do not say."""
    floor = 0.0 if met is None else met
    if (failed is not None and failed <= low) or floor > high:
        return False
    if failed is not None and low <= floor and failed <= ladder.above(high):
        return True
    return None


def verify_candidate(config: ServingConfig, replays: Sequence[tuple[Schedule, Path]], slos: Mapping, *,
                     repo: str | Path | None, url: str | None, progress=None, log=None,
                     more: Callable[[list[dict]], Sequence[tuple[Schedule, Path]]] | None = None) -> list[dict]:
    """Replay each ``(schedule, out_dir)`` in turn on Triton configured with ``config``; writes each results folder
    (with its schedule) and returns their summaries. When they are done, ``more`` (once, given the summaries so far)
    may add replays, run on the same server. On the embedded server a replay cut short by the server or a
    model instance dying is run again on a new server (at most ``MAX_RESTARTS`` times a replay, each noted through
    ``log`` and in its records' ``restarts``); an external server (``url``) is not ours to restart. On the embedded
    server no request is cancelled: a replay still answered :func:`cut_after_s` after its last arrival (far above
    capacity) is cut, its server stopped, its unanswered requests failed (``stop_reason`` says so), and the next
    replay runs on a new server."""
    served = list(replays[0][0].models) if replays else []
    cut_s = cut_after_s(slos)
    summaries: list[dict] = []
    pending, asked = list(replays), more is None

    def next_replay() -> tuple[Schedule, Path] | None:
        nonlocal asked
        if len(summaries) == len(pending) and not asked:
            asked = True
            pending.extend(more(list(summaries)))
        return pending[len(summaries)] if len(summaries) < len(pending) else None

    with tempfile.TemporaryDirectory(prefix="serving-bench-verify-") as tmp:
        copy = None
        if not url:
            copy = copy_repo(repo, Path(tmp) / "repo")
            config.apply_to_repo(copy)
        restarts: list[str] = []
        while next_replay() is not None:
            with connect(copy, url=url, models=served,
                         threads_per_instance=config.threads_per_instance or None) as server:
                if url:
                    apply_to_server(url, config)
                while (replay := next_replay()) is not None:
                    schedule, out_dir = replay
                    records, cut = _replay(server, schedule, cut_s, url, progress)
                    reason = records.info.stop_reason or ""
                    if not (cut or url or not records.info.partial or reason.startswith("interrupted")
                            or len(restarts) >= MAX_RESTARTS):
                        restarts.append(f"the replay stopped early ({reason}); replayed again on a new server")
                        (log or print)(f"note: {restarts[-1]} (restart {len(restarts)} of at most {MAX_RESTARTS})")
                        break
                    if cut:
                        records = records.with_info(stop_reason=f"cut: still answering {cut_s:g} s after "
                                                    "its last arrival, its server was stopped (no request cancelled) "
                                                    "and its unanswered requests failed")
                        (log or print)(f"note: a replay at {out_dir.name} was {records.info.stop_reason}; "
                                       "the next one runs on a new server")
                    summaries.append(write_results(out_dir, records.with_info(restarts=tuple(restarts)), schedule,
                                                   slos={m: dict(s) for m, s in slos.items()}))
                    restarts = []
                    if cut:
                        break
    return summaries


def _replay(server, schedule: Schedule, cut_s: float, url: str | None, progress):
    """(records, cut): on the embedded server no request is cancelled, a replay still answered ``cut_s`` after its
    last arrival is cut by stopping the server (:func:`~serving_bench.load.uncancelled.replay_or_cut`); an external
    server is not ours to stop, so its requests carry the driver's deadline."""
    if url:
        return adapters.replay(server, schedule, progress), False
    return replay_or_cut(server, schedule, cut_s, progress)


@dataclass(frozen=True)
class Where:
    """Where a candidate is verified: the embedded server on a copy of ``repo``, or the external one at ``url``;
    ``progress`` and ``log`` as :func:`verify_candidate` takes them."""

    repo: str | Path | None
    url: str | None = None
    progress: Callable | None = None
    log: Callable[[str], None] | None = None


def verify_on_entries(config: ServingConfig, chosen: Mapping[str, str], replays: Sequence[tuple[Schedule, Path]],
                      slos: Mapping, where: Where,
                      more: Callable[[list[dict]], Sequence[tuple[Schedule, Path]]] | None = None) -> list[dict]:
    """:func:`verify_candidate` of a candidate whose models are served by the ``chosen`` entries (``config`` named
    by them): each slot's requests sent to its entry, the summaries given back (and given to ``more``) under the
    slots' names."""
    def renamed(pairs):
        return [(renamed_schedule(schedule, chosen), out) for schedule, out in pairs]

    def more_renamed(summaries):
        return renamed(more([summary_for_slots(s, chosen) for s in summaries]))

    summaries = verify_candidate(config, renamed(replays), {chosen.get(m, m): s for m, s in slos.items()},
                                 repo=where.repo, url=where.url, progress=where.progress, log=where.log,
                                 more=more_renamed if more else None)
    return [summary_for_slots(s, chosen) for s in summaries]


def compare(simulated: dict, measured: dict) -> dict:
    """Per-model figures of both summaries (``{"simulated": {m: {...}}, "measured": {m: {...}}}``)."""
    keys = ("p50_s", "p99_s", "throughput_rps", "mean_exec_batch")
    return {side: {m: {k: s.get(k) for k in keys} for m, s in summ["models"].items()}
            for side, summ in (("simulated", simulated), ("measured", measured))}


def capacity_check(result: dict, outcomes: Sequence[tuple[Replay, bool]], growth: str,
                   ladder: Ladder = Ladder()) -> dict:
    """What the replays ``(replay, SLOs met)`` say of a candidate's predicted capacity (``result``): the measured
    bracket, whether the SLOs held at the predicted capacity (None when it is 0: the candidate misses them at 1x),
    whether the replays agree with the prediction (met at the capacity, missed one rung above; a capped capacity met
    at the top; a candidate predicted to miss at 1x missed there) and, where it has a capacity interval, whether the
    measured capacity lies inside it (``interval``: its ends and ``holds``, :func:`interval_holds`)."""
    met, failed = measured_bracket([(r.scale, ok) for r, ok in outcomes])
    verdict = {r.label: ok for r, ok in outcomes}
    if result["capacity_scale"] <= 0:
        agrees = not verdict["load"]
    elif result["capacity_capped"]:
        agrees = verdict["capacity"]
    else:
        agrees = verdict["capacity"] and not verdict["above"]
    check = {"growth": growth, "predicted_scale": result["capacity_scale"], "capped": result["capacity_capped"],
             "held_at_capacity": verdict.get("capacity"), "measured_met_scale": met, "measured_failed_scale": failed,
             "agrees": bool(agrees)}
    interval = result.get("capacity_interval") or {}
    if interval.get("low_scale") is not None and interval.get("high_scale") is not None:
        low, high = interval["low_scale"], interval["high_scale"]
        check["interval"] = {"low_scale": low, "high_scale": high, "confidence": interval.get("confidence"),
                             "holds": interval_holds(low, high, met, failed, ladder)}
    return check
