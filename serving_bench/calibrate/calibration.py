"""The co-located calibration runs and the device's sharing law fitted to them through the simulator
(:func:`serving_bench.sim.interference.fit`): closed loops of one-row requests (each model alone with ``calibrate``
clients, beside the longest, all together) and open loops beside the longest model's occasional batches, whose
requests give the wait for a core (:func:`~serving_bench.calibrate.waits.quiet_wait`). A fit that misses its own
runs, or sits on a bound of a parameter's range, is noted in the profile (:func:`fit_warning`). Each closed loop runs
``rounds`` times in a row, and the first once more at the end of the phase, minutes later: how much the rounds of
each loop differ beyond their finite samples is the host's run-to-run spread
(:func:`~serving_bench.calibrate.estimators.host_spread`, the profile's ``host_spread``)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from functools import partial

import numpy as np

from serving_bench.calibrate.estimators import host_spread, round_speed
from serving_bench.calibrate.lab import Lab
from serving_bench.calibrate.plan import DEFAULT_LAW, QUIET_RATES_RPS, QUIET_SECONDS, calibration_serving
from serving_bench.calibrate.runs import LoopRun
from serving_bench.calibrate.session import Session, Step
from serving_bench.calibrate.waits import WAITED_S, QuietWait, quiet_wait
from serving_bench.profiles.law import GPU_LAW, Law
from serving_bench.profiles.schema import HostSpread, Profile
from serving_bench.serving_config import ModelServing, default_threads
from serving_bench.sim.interference import WAIT_S_RANGE, Observation, fit, pinned, tail_error, with_law

FIT_WARNING = 0.25  # a law fit whose mean throughput error exceeds this is flagged in the log and the profile's notes
UNCERTAIN_NOTE = "the sharing law misses its own calibration runs"  # how that note starts (:func:`uncertain`)
LOADED_CLIENTS = 8  # a lone model's loaded calibration run: this many clients per calibration instance


@dataclass
class Calibration:
    """The phase under way: the ``device`` the models share, how each is served (``calibrate`` instances each, at
    ``per_instance`` runtime threads), the ``slowest`` model, and the open loops' runs by rate."""

    lab: Lab
    device: str
    serving: dict[str, ModelServing]
    per_instance: int
    slowest: str
    quiet_runs: dict[float, LoopRun] = field(default_factory=dict)
    rounds: dict[tuple, list[tuple[float, float]]] = field(default_factory=dict)  # per closed loop: round_speed's


def closed_round(cal: Calibration, clients: dict[str, int], session: Session, speeds: list) -> LoopRun:
    """One round of the closed loop of one-row requests, ``clients`` per model; its speed
    (:func:`~serving_bench.calibrate.estimators.round_speed`) appended to ``speeds`` where it has one."""
    run = session.run({m: (1, c) for m, c in clients.items()}, cal.lab.plan.config.seconds)
    speed = round_speed({m: run.done[m] for m in clients})
    if speed is not None:
        speeds.append(speed)
    return run


def observe(cal: Calibration, clients: dict[str, int], session: Session) -> Observation:
    """Closed loops of one-row requests, ``clients`` per model, ``rounds`` times: the median answered requests per
    second and p99 of each model."""
    config = cal.lab.plan.config
    rates: dict[str, list[float]] = {m: [] for m in clients}
    tails: dict[str, list[float]] = {m: [] for m in clients}
    speeds = cal.rounds[tuple(sorted(clients.items()))] = []  # a step run again on a new server starts afresh
    for _ in range(config.rounds):
        run = closed_round(cal, clients, session, speeds)
        for m in clients:
            rates[m].append(len(run.latency[m]) / config.seconds)
            tails[m].append(float(np.percentile(run.latency[m], 99)))
    obs = Observation(cal.device, {m: cal.serving[m] for m in clients}, clients,
                      {m: float(np.median(v)) for m, v in rates.items()},
                      measured_p99={m: float(np.median(v)) for m, v in tails.items()}, threads=cal.per_instance)
    cal.lab.log(f"co-located: {obs.label()}: " + ", ".join(f"{m} {r:.1f} req/s" for m, r in obs.measured_rps.items()))
    return obs


def observe_again(cal: Calibration, clients: dict[str, int], session: Session) -> None:
    """The closed loop of ``clients`` once more, its speed one more round of that loop's (none where the loop's own
    step was not kept): a round minutes after the others, for the host spread."""
    speeds = cal.rounds.get(tuple(sorted(clients.items())))
    if speeds is not None:
        closed_round(cal, clients, session, speeds)


def observe_quiet(cal: Calibration, rate: float, session: Session) -> Observation:
    """The open loop of every model beside the longest's occasional batches, the others at ``rate``: its p99s."""
    models = cal.lab.plan.models
    rates, run = cal.lab.quiet_run(session, rate)
    cal.quiet_runs[rate] = run
    obs = Observation(cal.device, cal.serving, {}, {m: len(run.latency[m]) / QUIET_SECONDS for m in models},
                      measured_p99={m: float(np.percentile(run.latency[m], 99)) for m in models},
                      rates=rates, seconds=QUIET_SECONDS, threads=cal.per_instance)
    cal.lab.log(f"open loop: {obs.label()}: p99 " + ", ".join(f"{m} {v * 1e3:.2f} ms"
                                                          for m, v in obs.measured_p99.items()))
    return obs


def steps(cal: Calibration) -> list[Step]:
    """Each model alone with ``calibrate`` clients; with three models or more each beside the longest (one client
    each: the waits behind a long execution); all together with one client each and with ``calibrate`` each (a lone
    model: twice the clients, queued for its instances, and with dynamic batching :data:`LOADED_CLIENTS` times:
    batches of several requests, where perf_analyzer's sweeps and the tuner go); the open loops."""
    plan = cal.lab.plan
    models, calibrate = plan.models, plan.config.calibrate
    loads = [{m: calibrate} for m in models]
    if len(models) > 2:
        loads += [{cal.slowest: 1, m: 1} for m in models if m != cal.slowest]
    if len(models) > 1:
        loads += [{m: 1 for m in models}, {m: calibrate for m in models}]
    else:
        loads += [{models[0]: 2 * calibrate}]
        if plan.batched(models[0]):
            loads += [{models[0]: LOADED_CLIENTS * calibrate}]
    out: list[Step] = [(tuple(sorted(clients.items())), partial(observe, cal, clients)) for clients in loads]
    if plan.quiet_waits:  # and beside its occasional batches, as on the one-instance server
        out += [(("open", rate), partial(observe_quiet, cal, rate)) for rate in QUIET_RATES_RPS]
    return out + [(("again",) + out[0][0], partial(observe_again, cal, loads[0]))]


def calibration_runs(lab: Lab) -> tuple[list[Observation], QuietWait | None, HostSpread | None]:
    """The phase's observations (none where the plan is not calibrated), the wait for a core it measured and the
    host's run-to-run spread its rounds give."""
    plan = lab.plan
    if not plan.calibrated:
        return [], None, None
    calibrate, models = plan.config.calibrate, plan.models
    device = plan.devices[models[0]]
    cal = Calibration(lab, device, {m: calibration_serving(plan.configs[m], device, calibrate, plan.sizes[m][-1])
                                    for m in models},
                      default_threads(calibrate * len(models)) if plan.spread else plan.threads, lab.longest()[0])
    done: dict = {}
    lab.run_phase(steps(cal), done, lab.sessions(calibrate, cal.per_instance), "calibration")
    waits = None
    if plan.quiet_waits:
        one = [lab.runs[("quiet", 1, rate)] for rate in QUIET_RATES_RPS]
        waits = quiet_wait(list(cal.quiet_runs.values()), cal.slowest, WAIT_S_RANGE, calibrate * len(models),
                           (len(models), one))
    if waits is not None:
        fewer = (f"; on one instance per model ({waits.instances_fewer} in all) {waits.waited_fewer} of "
                 f"{waits.beside_fewer}: wait_p {waits.p_fewer:.2f}" if waits.p_fewer is not None else "")
        lab.log(f"{device}: beside {cal.slowest}'s occasional batches, on {calibrate} instances per model "
                f"({waits.instances} in all) {waits.waited} of {waits.beside} requests waited > "
                f"{WAITED_S * 1e3:g} ms on their way in: wait_p {waits.p:.2f}, a wait up to "
                f"{waits.slice_s * 1e3:.1f} ms, after {waits.quiet_s * 1e3:.1f} ms of quiet{fewer} (the chance "
                "follows the host's instances in all: docs/sim.md#waiting-for-a-core-wait)")
    spread = host_spread(list(cal.rounds.values()))
    if spread is not None:
        lab.log(f"{device}: the host's run-to-run spread: {spread.sigma * 100:.1f} % (the log throughput's standard "
                f"deviation between the rounds of {spread.runs} closed loops beyond their finite samples, "
                f"{spread.df} degrees of freedom)")
    return [o for o in done.values() if o is not None], waits, spread


def fit_sharing_law(lab: Lab, profile: Profile, observations: list[Observation],
                    waits: QuietWait | None) -> Profile:
    """The profile with its device shared by the law fitted to ``observations`` (the plan's ``law``, by default
    :data:`~serving_bench.calibrate.plan.DEFAULT_LAW` on a CPU host and the GPU's default on a GPU; the wait for a
    core as measured, where it was) and the runs kept (``calibration``); a note where the fit is uncertain."""
    device = observations[0].device
    form = lab.plan.config.law or (GPU_LAW if profile.devices[device].kind == "gpu" else DEFAULT_LAW)
    fitted, err = fit(profile, device, observations, form, measured=waits.law() if waits is not None else None)
    profile = dataclasses.replace(with_law(profile, device, fitted),
                                  calibration=tuple(o.to_json() for o in observations))
    text = ", ".join(f"{k} {v:.3g}" for k, v in fitted.params().items())
    tails = f" and p99 error of {tail_error(profile, observations) * 100:.1f} %" if fitted.wait_p is not None else ""
    lab.log(f"{device}: sharing law {form}" + (f" ({text})" if text else "") +
            f" fits the {len(observations)} co-located runs with a mean throughput error of {err * 100:.1f} %{tails}")
    warning = fit_warning(fitted, err)
    if warning is not None:
        lab.log(f"warning: {warning}")
        profile = dataclasses.replace(profile, notes=profile.notes + (warning,))
    return profile


def fit_warning(law: Law, err: float) -> str | None:
    """The profile's note (starting :data:`UNCERTAIN_NOTE`) when its law, fitted with mean throughput error ``err``
    on its calibration runs, misses them by more than :data:`FIT_WARNING` or sits on a bound of a parameter's range
    (:func:`~serving_bench.sim.interference.pinned`); None when the fit is trustworthy."""
    bounds = pinned(law)
    if err <= FIT_WARNING and not bounds:
        return None
    why = (f"by {err * 100:.0f} % on average (over {FIT_WARNING * 100:.0f} %)" if err > FIT_WARNING else
           "with " + ", ".join(f"{k} {getattr(law, k):.3g} on a bound of its range {lo:g}..{hi:g}"
                               for k, (lo, hi) in bounds.items()) +
           f" (mean error {err * 100:.0f} %)")
    return (f"{UNCERTAIN_NOTE} {why}: predictions from this profile are uncertain; measure it again on a quiet "
            "machine (nothing else running)")


def uncertain(profile: Profile) -> bool:
    """Does the profile's sharing law miss its own calibration runs (:func:`fit_warning`: its notes say so)?"""
    return any(note.startswith(UNCERTAIN_NOTE) for note in profile.notes)
