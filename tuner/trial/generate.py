"""One generative replay of a vLLM-backend model, measured twice: by the replay, from each request's
due time (`tuner.measurement_tokens`), and by the engine, from its own `vllm:` series on Triton's
`/metrics` over the same replay (`tuner.llm.engine_metrics`), so that each can be checked against the
other. The engine's histograms count every request the replay sent, warm-up included: `whole` is the
replay's measurement of those same requests. Its gauges are sampled while the replay runs
(`tuner.llm.engine_watch`): after it they read an engine at rest.

    replay_generate(launcher, settings, traffic, *, speed, ...) -> GenerateRun
    make_token_probe(launcher, settings, windows) -> Probe   speed -> TokenMeasurement: a trial's step,
                                                             with the engine's batching watched meanwhile
                                      (`tuner.trial.step`'s windows and retry policy; never repeated;
                                      with `cut_tokens_per_s`, a step whose engine fell behind its window
                                      ends at the window's end: `behind_below`)
    make_settled_probe(launcher, settings, traffic, *, load, check) -> (Probe, warm-ups)   its capacity
                                      steps, each warmed by a request's life at the fastest speed that held
    falls_behind(m, average_tokens_per_s=...) -> bool   the rule keeping_up applies
    behind_below(part, speed, ...) -> float   the same rule as a streamed rate, known before the replay
    settled_warmup_s(m) -> float      a request's mean life end to end in a measurement, in seconds
    keeping_up(check, tokens_per_s=...) -> check   a capacity step's SLA check that also fails an engine
                                      fallen behind its window at fewer output tokens/s than the traffic's
                                      average at that speed
    check_context(traffic, context, *, model)   before a server starts: every request fits the engine
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from tuner.errors import TrafficError, traffic_row
from tuner.llm.engine_metrics import EngineFigures
from tuner.llm.engine_watch import EngineWatch, Stretch, batch_figures
from tuner.measurement_tokens import TokenMeasurement, measure_tokens, short_window
from tuner.score import SlaCheck
from tuner.server import Launcher, exit_watch
from tuner.settings import StudySettings
from tuner.traffic import due_offsets
from tuner.trial.capacity import Probe
from tuner.trial.step import TRIES, Windows, retry_workers, step_windows, with_retries

if TYPE_CHECKING:  # an annotation only: this side imports the replay where it runs one
    from tuner.replay import ReplayResult

__all__ = ["BEHIND", "GenerateRun", "IDLE_WAIT_S", "behind_below", "check_context", "falls_behind", "keeping_up",
           "load_check", "make_settled_probe", "make_token_probe", "replay_generate", "settled_warmup_s"]

# after a replay cut its streams, the engine still holds them until Triton's next write to each finds the
# client gone (a queued request: its first token) and the model aborts it: the next replay waits that long
IDLE_WAIT_S = 60.0


@dataclass(frozen=True)
class GenerateRun:
    """A generative replay's figures: its measured window, all its requests, and the engine's view."""

    measurement: TokenMeasurement  # the requests due after the warm-up
    whole: TokenMeasurement        # every request sent (the engine's histograms count them all)
    engine: EngineFigures | None   # None: the server reports no vllm: series for the model
    first_error: str = ""          # the first failed request's error, as the replay recorded it
    stretch: Stretch | None = None  # the engine over the replay: counters and its gauges' sampled peaks
    replay: ReplayResult | None = None  # the replay itself (its requests: `tuner replay --records`)


def replay_generate(launcher: Launcher, settings: StudySettings, traffic: pd.DataFrame, *, speed: float,
                    duration_s: float | None = None, progress: bool = False, prompts=None,
                    warmup_s: float | None = None, workers: int | None = None,
                    cut_below_tokens_per_s: float | None = None) -> GenerateRun:
    """Replay `traffic` (rows with prompt_tokens and output_tokens) at `speed` against the generative
    model the server runs, streaming each request, and measure it (`duration_s`: measure only that
    long after the warm-up; `warmup_s` and `workers` override `replay.warmup_s` and `replay.workers`;
    `cut_below_tokens_per_s`: `tuner.replay.replay`'s, and a replay that cut its streams returns once
    the engine let them go, up to IDLE_WAIT_S)."""
    from tuner.replay import replay  # Locust runs in its own processes; this side stays unpatched

    model, sla = settings.model, settings.sla
    warmup_s = settings.replay.warmup_s if warmup_s is None else warmup_s
    replay_settings = settings.replay if workers is None else dataclasses.replace(settings.replay, workers=workers)
    with EngineWatch(launcher.endpoints.metrics, model) as watch:
        # a server that dies ends the replay at once, with the launcher's error (not the schedule's end)
        result = replay(launcher.endpoints, model, traffic, speed=speed, settings=replay_settings,
                        warmup_s=warmup_s, duration_s=None if duration_s is None else warmup_s + duration_s,
                        stats=lambda: launcher.statistics(model), progress=progress, prompts=prompts,
                        watch=exit_watch(launcher, model), cut_below_tokens_per_s=cut_below_tokens_per_s)
        if result.cut:
            watch.wait_idle(IDLE_WAIT_S)
        stretch = watch.mark()

    def measured(warmup: float) -> TokenMeasurement:
        return measure_tokens(result.records, speed=speed, warmup_s=warmup,
                              lag_budget_ms=settings.replay.lag_budget_ms, sla_percentile=sla.percentile,
                              ttft_ms=sla.ttft_ms, tpot_ms=sla.tpot_ms, e2e_ms=sla.e2e_ms, load_generator_cpu=result.load_generator_cpu,
                              workers=result.workers, duration_s=result.duration_s)

    failed = result.records[~result.records["ok"].to_numpy(dtype=bool)]
    first_error = str(failed["error"].iloc[0]) if len(failed) else ""
    return GenerateRun(measured(result.warmup_s), measured(0.0), stretch.figures if stretch is not None else None,
                       first_error, stretch, result)


def make_token_probe(launcher: Launcher, settings: StudySettings, windows: Windows, *, tries: int = TRIES,
                     on_measure: Callable[[TokenMeasurement], None] | None = None,
                     cut_tokens_per_s: float | None = None) -> Probe:
    """Measure the generative model the server runs at a speed, as `tuner.trial.step.make_probe` measures an
    encoder: the step's window, and again with more load-generator processes while the send lag broke its
    budget. Not repeated near the SLA's limit (that policy reads an encoder's latency). With
    `cut_tokens_per_s` (the traffic's average output tokens per second at speed 1, as `keeping_up` takes
    it), a step whose engine fell behind its window is cut at the window's end (`behind_below`): its
    verdict is settled there, and its queue would take longer to drain the more it fell behind."""
    used = [0]  # the processes the attempt before used (tuner.trial.step.make_probe's rule)

    def run(speed: float, attempt: int) -> TokenMeasurement:
        part, warmup, end = windows(speed)
        workers = retry_workers(max(settings.replay.workers, used[0])) if attempt else None
        cut = (behind_below(part, speed, warmup_s=warmup, end_s=end, tokens_per_s=cut_tokens_per_s)
               if cut_tokens_per_s is not None and end is not None else None)
        run = replay_generate(launcher, settings, part, speed=speed, warmup_s=warmup, workers=workers,
                              duration_s=None if end is None else end - warmup, cut_below_tokens_per_s=cut)
        used[0] = run.measurement.workers
        return dataclasses.replace(run.measurement, engine=batch_figures(run.stretch))

    return with_retries(run, tries=tries, on_measure=on_measure)


def make_settled_probe(launcher: Launcher, settings: StudySettings, traffic: pd.DataFrame, *,
                       load: TokenMeasurement, check: Callable[[TokenMeasurement, object], object],
                       on_measure: Callable[[TokenMeasurement], None] | None = None,
                       cut_tokens_per_s: float | None = None) -> tuple[Probe, dict[float, float]]:
    """A generative trial's capacity probe, and the warm-up each speed got (filled in as it runs).

    A short step from an idle engine measures a burst the engine absorbs, not the rate it holds: the
    LLM quick start's engine passed 8x its load after 1 s of traffic and failed it after 6 or 15 s,
    and passed 6x after 6 s but failed it after 15 s; its capacity read twice what it sustained. So
    each capacity step replays, before its window, as much of the traffic (`step_windows(fill=True)`)
    as a request took end to end (`settled_warmup_s`) at the fastest speed that held the SLA so far,
    the recorded load to begin with: by then the engine carries its steady share of sequences.
    `cut_tokens_per_s`: `make_token_probe`'s (where `check` is `keeping_up`'s)."""
    held = [settled_warmup_s(load)]
    used: dict[float, float] = {}

    def measured(m: TokenMeasurement) -> None:
        if m.valid and check(m, settings.sla).ok:
            held.append(settled_warmup_s(m))
        if on_measure is not None:
            on_measure(m)

    def windows(speed: float):
        warmup = used[float(speed)] = max(settings.replay.warmup_s, *held)
        return step_windows(traffic, settings, warmup_s=warmup, fill=True)(speed)

    return make_token_probe(launcher, settings, windows, on_measure=measured, cut_tokens_per_s=cut_tokens_per_s), used


# a step's engine counts as behind its window when it streamed less than this share of what the
# window's requests asked for per second: a margin for the stream's lag behind the window, which the
# settled warm-up leaves but does not cancel (an engine keeping up on even traffic streams 0.9-1.1 of it)
BEHIND = 0.9


def keeping_up(check: Callable[[TokenMeasurement, object], SlaCheck], *, tokens_per_s: float
               ) -> Callable[[TokenMeasurement, object], SlaCheck]:
    """`check` (a generative capacity step's SLA check), and a step also fails when the engine fell
    behind its window (it streamed less than BEHIND x the output tokens per second its requests asked
    for) at a rate below what the traffic offers on average at the step's speed (`tokens_per_s`:
    `tuner.traffic.mean_output_tps`, at speed 1): its queue then grows for as long as the load lasts.

    A step lasts seconds, and a queue that grows for seconds still meets a TTFT limit: the LLM quick
    start's engine streamed about 1,000 output tokens/s however fast the load, and its 20-s steps met
    the SLA at 1.0 and 1.15x the recording, whose traffic offers 1,067 and 1,227 tokens/s on average;
    its whole busiest two minutes replayed at those speeds missed it (TTFT p99 1.3 and 6.7 s), and at
    0.8x (854 tokens/s) met it. An engine that keeps up with its window streams about what the window
    asked for, whatever the average (the window is the busiest stretch).

    Such a step's check also says where the capacity lies (`holds_speed`): the speed at which the
    traffic's average asks for what the engine streamed, which the capacity search probes toward."""
    def checked(m: TokenMeasurement, sla) -> SlaCheck:
        c = check(m, sla)
        average = m.speed * tokens_per_s
        # a step cut at its window's end was cut because this rule held there (`behind_below`)
        if not m.valid or not (m.cut_requests or falls_behind(m, average_tokens_per_s=average)):
            return c
        reason = (f"the engine fell behind, streaming {m.streamed_tokens_per_s:,.0f} output tokens/s (its window "
                  f"asked for {m.offered_tokens_per_s:,.0f}), below the {average:,.0f} the traffic offers on "
                  f"average at speed {m.speed:.3g}: its queue grows for as long as the load lasts"
                  + (f" (the step ended with its window: {m.cut_requests:,} streams still open were cut, "
                     "their latencies left out)" if m.cut_requests else ""))
        return SlaCheck(False, c.latency_ms, c.error_rate, max(c.violation, 1.0 - m.streamed_tokens_per_s / average),
                        "; ".join(r for r in (c.reason, reason) if r),
                        holds_speed=float(m.streamed_tokens_per_s / tokens_per_s))

    return checked


def load_check(check: Callable[[TokenMeasurement, object], SlaCheck], load: TokenMeasurement, *,
               tokens_per_s: float) -> Callable[[TokenMeasurement, object], SlaCheck]:
    """The check a generative trial's replay at the recorded load is judged by: `keeping_up`, as its
    capacity steps are (an engine that falls behind the load meets a TTFT limit for the window's seconds,
    then not: the capacity search took that replay as its lower bound, and the study reported a
    capacity the engine does not hold), unless the window lasts under WINDOW_LIVES of its requests'
    lives: its streamed rate then reads low whatever the engine does, and the latency judges alone."""
    if short_window(load.duration_s, life_s=settled_warmup_s(load)):
        return check
    return keeping_up(check, tokens_per_s=tokens_per_s)


def falls_behind(m: TokenMeasurement, *, average_tokens_per_s: float) -> bool:
    """Whether the engine fell behind its window (streamed < BEHIND x what the window asked for, per
    second) at a rate below `average_tokens_per_s` (the traffic's average at the replay's speed)."""
    streamed = m.streamed_tokens_per_s
    return bool(average_tokens_per_s > 0 and math.isfinite(streamed) and streamed < average_tokens_per_s
                and streamed < BEHIND * m.offered_tokens_per_s)


def behind_below(part: pd.DataFrame, speed: float, *, warmup_s: float, end_s: float, tokens_per_s: float) -> float:
    """The streamed rate (output tokens per second over the window from `warmup_s` to `end_s` of `part`
    replayed at `speed`) below which `falls_behind` holds for that replay: BEHIND x what the window's
    requests ask for per second, or the traffic's average at that speed (`tokens_per_s` at speed 1),
    whichever is lower. Known before the replay: `tuner.replay.replay` cuts there."""
    due = due_offsets(part, speed)
    inside = (due >= warmup_s) & (due < end_s)
    asked = float(part["output_tokens"].to_numpy(dtype=float)[inside].sum())
    return min(BEHIND * asked / (end_s - warmup_s), speed * tokens_per_s) if end_s > warmup_s else 0.0


def settled_warmup_s(load: TokenMeasurement) -> float:
    """The warm-up a generative step needs before its window: the mean end-to-end time of the
    requests measured at the recorded load, in seconds (0 when none finished). By Little's law the
    engine then holds about its steady number of sequences (the arrival rate x that time)."""
    return float(np.mean(load.e2es_ms)) / 1000.0 if len(load.e2es_ms) else 0.0


def check_context(traffic: pd.DataFrame, context: int, *, model: str) -> None:
    """Refuse, in one line, traffic holding a request longer (prompt + output tokens) than the model's
    context: the engine would refuse each such request, and a replay would measure refusals."""
    total = traffic["prompt_tokens"].to_numpy() + traffic["output_tokens"].to_numpy()
    over = total > context
    if over.any():
        first = int(over.argmax())
        raise TrafficError(
            f"{int(over.sum()):,} of {len(traffic):,} requests need more tokens than {model}'s context of "
            f"{context:,} (the first: {traffic_row(traffic, first)}, {int(traffic['prompt_tokens'].iloc[first]):,} "
            f"prompt + {int(traffic['output_tokens'].iloc[first]):,} output tokens); raise max_model_len in "
            "model.json where the model allows it, or replay a trace of shorter requests")
