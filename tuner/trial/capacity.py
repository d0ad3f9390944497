"""The capacity search, pure: the highest replay speed at which the SLA still holds.

Capacity is the highest replay speed `s` of the recorded traffic at which the SLA holds, found by
bracketing (doubling or halving from a guess) and then bisection in log space until the bracket's
relative width is within the tolerance. The measurement is injected: a `Probe`, speed -> Measurement
(`tuner.trial.step.make_probe` on a real server, `tuner.simulate` in software). A measurement whose
send lag broke its budget even after the probe's retries says nothing about the server: the search stops
there and says so (`limited_by="load_generator"`) instead of counting it as a server failure. A step
whose measured window holds no request (the traffic, at that speed, lasts less than the warm-up) says
nothing either, of the server or of the load generator: the search stops there with
`limited_by="traffic"`, its capacity the fastest speed the traffic could show, not the server's.

    Probe                 speed -> Measurement: one step's measurement, the one definition
    find_capacity(...)    -> Capacity (its Steps, the bracket, why it stopped)
    Hints                 what the search knows before a trial: where to start, what to beat
    Hints.around(s, tol)  a two-step confirmation of an estimated capacity (the simulation's)
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from tuner.measurement import Measurement
from tuner.score import SlaCheck, check_sla
from tuner.settings import CapacitySettings, SlaSettings

__all__ = ["Capacity", "Hints", "Probe", "Step", "find_capacity"]

Probe = Callable[[float], Measurement]


@dataclass(frozen=True)
class Step:
    """One step of the capacity search: the speed replayed, its measurement and its SLA check."""

    speed: float
    measurement: Measurement
    sla: SlaCheck
    @property
    def valid(self) -> bool:
        """Whether the step's replay kept its send-lag budget (if not, it says nothing of the server)."""
        return self.measurement.valid

    @property
    def attempts(self) -> int:
        """Replays run for this speed (more than 1 when the send lag broke its budget)."""
        return self.measurement.attempts


@dataclass(frozen=True, kw_only=True)
class Capacity:
    """Where the capacity search ended: the highest passing speed and its rate, the lowest failing one."""

    speed: float                 # highest speed that met the SLA (0 when none did)
    capacity_rps: float          # offered rate at that speed
    upper_speed: float | None    # lowest speed that broke the SLA (None: none did)
    upper_rps: float | None
    steps: tuple[Step, ...] = field(default_factory=tuple)
    converged: bool = False      # the bracket reached the tolerance
    pruned: bool = False         # stopped early: the bracket cannot beat `beat_rps`
    limited_by: str = ""         # "", "max_speed", "min_speed", "max_steps", "load_generator", "traffic"

    @property
    def at_capacity(self) -> Measurement | None:
        """The measurement at the capacity speed that met the SLA (None when no step passed)."""
        passing = [s for s in self.steps if s.valid and s.sla.ok and s.speed == self.speed]
        return passing[-1].measurement if passing else None


def find_capacity(
    probe: Probe,
    sla: SlaSettings,
    settings: CapacitySettings,
    *,
    start_speed: float | None = None,
    beat_rps: float | None = None,
    min_speed: float | None = None,
    growth: float = 2.0,
    rate: float | None = None,
    lower: Step | None = None,
    upper_guess: float | None = None,
    on_step: Callable[[Step], None] | None = None,
    check: Callable[[Measurement, SlaSettings], SlaCheck] = check_sla,
) -> Capacity:
    """Bracket, then bisect, the replay speed at which the SLA stops holding.

    `start_speed`: the first guess (e.g. from earlier trials; default `settings.start_speed`).
    `beat_rps`: the best capacity found so far; once the SLA breaks at an offered rate below it by
    more than the tolerance, this configuration is measurably worse and the search stops with
    `pruned=True`. A failure within the tolerance of the best is not enough: one short replay at the
    edge of capacity is noisy, and pruning an equal configuration on a bad draw would hide the
    optimum from the sampler (it then gets its full search, like any contender). Once a step fails at
    or under the best's capacity, the next goes a tolerance under it: a pass converges, a failure prunes.
    `growth`: the bracketing factor (2 from a blind guess; smaller from an informed one).
    `rate`: the profile's requests/s at speed 1; then capacity_rps = speed x rate (monotone in the
    speed even when each step replays a different window). Default: the step's measured offered rate.
    `lower`: a step already measured that met the SLA (e.g. at the recorded load): a lower bound.
    `check`: the SLA check of a step's measurement (`tuner.score.check_tokens` for a generative model's).
    A failing step whose check says where the capacity lies (`SlaCheck.holds_speed`: a generative
    engine's token rate) turns the bisection toward it (`_inside`).
    `upper_guess`: a speed an earlier search found breaking the SLA (its bracket's upper edge): once a
    step passes below it, it is probed next, instead of `growth` above. A re-measurement that starts at
    the earlier bracket's lower edge thus confirms a converged bracket in two steps (pass at the lower
    edge, fail at the upper), and goes on searching as usual when the server moved.
    """

    def rps(step: Step) -> float:
        return step.speed * rate if rate is not None else step.measurement.offered_rps

    speed = min(start_speed or settings.start_speed, settings.max_speed)
    if lower is not None and speed <= lower.speed:  # already known to pass there: start above it
        speed = min(lower.speed * growth, settings.max_speed)
    floor = min_speed if min_speed is not None else speed / 2 ** settings.max_steps
    lo: Step | None = lower if lower is not None and lower.valid and lower.sla.ok else None
    hi: Step | None = None
    steps: list[Step] = []

    def done(**kw) -> Capacity:
        return Capacity(
            speed=lo.speed if lo else 0.0,
            capacity_rps=rps(lo) if lo else 0.0,
            upper_speed=hi.speed if hi else None,
            upper_rps=rps(hi) if hi else None,
            steps=tuple(([lower] if lower is not None else []) + steps),
            **kw,
        )

    while len(steps) < settings.max_steps:
        m = probe(speed)
        step = Step(speed, m, check(m, sla))
        steps.append(step)
        if on_step:
            on_step(step)
        if not step.valid:  # no verdict on the server: the traffic too short for the speed, or the sender late
            return done(limited_by="traffic" if m.requests == 0 else "load_generator")
        if step.sla.ok:
            lo = step
        else:
            hi = step
            # a hair over `beat_rps`: a probe a tolerance under a failure at the best's own rate must prune
            if beat_rps is not None and rps(step) * (1.0 + settings.tolerance) <= beat_rps * (1.0 + 1e-6):
                return done(pruned=True)
        if lo and hi and hi.speed <= lo.speed:  # noise: a lower bound that fails above... keep the latest
            lo = None
        if lo and hi:
            if hi.speed / lo.speed <= 1.0 + settings.tolerance:
                return done(converged=True)
            speed = _inside(lo.speed, hi.speed, tolerance=settings.tolerance, holds=hi.sla.holds_speed)
        elif lo:  # bracketing upwards
            if lo.speed >= settings.max_speed:
                return done(limited_by="max_speed")
            speed = min(lo.speed * growth, settings.max_speed)
            if upper_guess is not None and lo.speed < upper_guess < speed:  # the earlier bracket's edge
                speed = upper_guess
            upper_guess = None  # once: past it, the usual bracketing
        else:  # bracketing downwards
            if hi.speed <= floor:
                return done(limited_by="min_speed")
            speed = max(hi.speed / growth, floor)
        if hi is not None and beat_rps is not None and rps(hi) <= beat_rps:
            # failed at or under the best's capacity, so it cannot beat it: a tolerance under the failure
            # either passes (the bracket converges) or fails measurably under the best (pruned), where a
            # bisection from the lower bound takes a step per halving to the same end
            speed = max(_tolerance_under(hi.speed, settings.tolerance), lo.speed if lo else floor)
    return done(limited_by="max_steps")


# a hair inside the tolerance: the search's `hi / lo <= 1 + tolerance` must hold in floats between a speed
# and the one a tolerance from it
def _tolerance_under(speed: float, tolerance: float) -> float:
    return speed / (1.0 + tolerance) * (1.0 + 1e-9)


def _tolerance_over(speed: float, tolerance: float) -> float:
    return speed * (1.0 + tolerance) * (1.0 - 1e-9)


def _inside(lo: float, hi: float, *, tolerance: float, holds: float | None) -> float:
    """The next speed between a passing `lo` and a failing `hi`: their geometric middle, unless the
    failing step's measurement says where the capacity lies (`holds`: SlaCheck.holds_speed, a
    generative engine's token rate, which reads low more often than high as its stream lags the window):
    - within a tolerance under `hi`: that tolerance-wide bracket's lower edge, which closes the search if
      it passes;
    - between `lo` and that: `holds` itself, a likely pass, which moves `lo` up to it;
    - at or under `lo` (as after that pass): a tolerance over `lo`, which closes the search if it fails.
    A wrong reading costs no step over the bisection on the fake server of tests/trial/test_capacity.py
    (readings 0.85-1.1x the truth, tolerances 0.1 and 0.25), and saves 5-17 % of the steps."""
    middle = math.sqrt(lo * hi)
    if holds is None:
        return middle
    under_hi, over_lo = _tolerance_under(hi, tolerance), _tolerance_over(lo, tolerance)
    if holds >= under_hi:
        return under_hi
    if holds > lo:
        return holds
    return over_lo if over_lo < hi else middle


@dataclass(frozen=True)
class Hints:
    """What the search knows before a trial: where to start the capacity search, what to beat."""

    start_speed: float | None = None
    beat_rps: float | None = None  # prune once the bracket cannot beat this capacity
    upper_speed: float | None = None  # a speed found breaking the SLA before: probed next after a pass

    @classmethod
    def around(cls, speed: float, tolerance: float, *, beat_rps: float | None = None) -> Hints:
        """Start from an estimated capacity `speed` (the simulation's): the search begins at the lower
        edge of a bracket just within `tolerance` wide with `speed` at its geometric middle and probes
        its upper edge next, so an estimate off by less than half the tolerance either way is confirmed
        in two steps (pass, then fail: converged), and a wrong one is searched from there as usual."""
        lower = speed / math.sqrt(1.0 + tolerance)
        return cls(start_speed=lower, upper_speed=_tolerance_over(lower, tolerance), beat_rps=beat_rps)
