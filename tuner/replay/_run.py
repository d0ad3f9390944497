"""The replay as ordinary code calls it: plan, start the Locust process(es), snapshot Triton's
statistics at the end of the warm-up, collect the per-request records.

The load generator runs in subprocesses (`python -m tuner.replay`) because Locust monkey-patches
whatever process imports it; this side stays unpatched (Optuna, the docker SDK, threads).

Warm-up: one continuous open-loop schedule, so the measured part starts on a warmed, loaded server
rather than an idle one. The load generator announces its start time t0 (system-wide monotonic clock);
this process takes the "before" statistics snapshot at t0 + warmup_s and the "after" snapshot once every
request has finished. Requests due before t0 + warmup_s are kept in the records but `measure` leaves
them out; the few in flight across the boundary (about rate x latency of them) are the only mismatch
between the records and the statistics deltas.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import pandas as pd

from tuner.errors import InputError, ServerError, TrafficError
from tuner.llm.prompts import Prompts
from tuner.localhost import owned_temporary_dir
from tuner.replay import _generate, _plan
from tuner.replay._calibrate import Calibration, available_cpus, cached_calibration, calibrate, choose_workers
from tuner.replay._processes import REPLAY_PREFIX, run_load_generator
from tuner.server.base import Endpoints, Watch
from tuner.settings import ReplaySettings
from tuner.traffic import due_offsets

Stats = Callable[[], dict]


@dataclass(frozen=True, kw_only=True)
class ReplayResult:
    """What one replay produced. `records` has one row per request of the schedule:
    row (position in the traffic, sorted by timestamp), due_s / send_s / end_s (seconds from the replay's start),
    latency_ms (end - due: from the due time), send_lag_ms (send - due), ok, error, worker. A generative
    replay (`generative`) adds prompt_tokens and output_tokens (asked), tokens (received), first_token_s
    and last_token_s (seconds from the start; NaN without tokens), itl_ms (an array per request: the
    gaps between its responses that carried tokens) and cut (open when the replay cut its streams)."""

    records: pd.DataFrame
    stats_before: dict | None   # Triton's model statistics at the end of the warm-up
    stats_after: dict | None    # ... once every request had finished
    speed: float
    warmup_s: float
    # the schedule's end, where its measured window ends: the `duration_s` it was asked to run (a step's
    # length at its speed, a --duration) however early its last request is due, else the last due time
    duration_s: float
    mode: str                   # "local" (one process) or "distributed" (master + workers)
    workers: int
    reason: str                 # why this mode
    load_generator_cpu: float   # CPU seconds per wall second, all load-generator processes together
    details: dict = field(default_factory=dict)
    # this host's load-generator calibration (measured once per run when `workers` was 0)
    calibration: Calibration | None = None
    peak_rps: float = 0.0       # the offered rate in the busiest second of the schedule
    stopped: bool = False       # ended early by `watch`: no records
    generative: bool = False    # streamed generate requests (tuner.measurement_tokens measures them)

    @property
    def cut(self) -> int:
        """The streams cut at the window's end (`replay`'s `cut_below_tokens_per_s`): 0 when none were."""
        return int(self.records["cut"].sum()) if "cut" in self.records.columns else 0

    def measured(self) -> pd.DataFrame:
        """The records of the measured part (due at or after the warm-up)."""
        return self.records[self.records["due_s"] >= self.warmup_s]


RECORDS_FRONT = ["replay", "speed", "measured"]  # records_table's first columns, which tell its files


def records_table(results: list[ReplayResult]) -> pd.DataFrame:
    """The requests of `results` (the replays behind one measurement: a retry after the send lag broke
    its budget, the repeats near the SLA), one row each, for a person to read or plot: `replay` (1, 2,
    ... in the order they ran), `speed`, `measured` (due at or after the warm-up: what the figures
    count), then the replay's own columns (ReplayResult) but `itl_ms`, a list per request."""
    frames = []
    for number, result in enumerate(results, 1):
        records = result.records.drop(columns=["itl_ms"], errors="ignore")
        frames.append(records.assign(replay=number, speed=result.speed,
                                     measured=records["due_s"] >= result.warmup_s))
    if not frames:
        return pd.DataFrame(columns=RECORDS_FRONT)
    table = pd.concat(frames, ignore_index=True)
    return table[RECORDS_FRONT + [c for c in table.columns if c not in RECORDS_FRONT]]


def replay(
    endpoints: Endpoints,
    model: str,
    traffic: pd.DataFrame,
    *,
    speed: float,
    settings: ReplaySettings,
    warmup_s: float | None = None,
    duration_s: float | None = None,
    stats: Stats | None = None,
    progress: bool = False,
    watch: Watch | None = None,
    watch_every_s: float = 1.0,
    prompts: Prompts | None = None,
    cut_below_tokens_per_s: float | None = None,
) -> ReplayResult:
    """Replay `traffic` against `model` at `speed`, open loop, and return the per-request records.

    `duration_s` cuts the schedule to requests due within that many seconds (warm-up included), and
    is where its measured window ends (`ReplayResult.duration_s`; default: the last due time);
    `warmup_s` defaults to `settings.warmup_s`; `stats` returns the model's Triton statistics
    (default: `v2/models/<model>/stats` over HTTP). `watch(seconds since the start) -> stop?` is called
    every `watch_every_s` and may end the replay early (`stopped`: no records; the warm-up uses it to
    stop once the server is steady), or raise (`tuner.server.exit_watch`: the server exited). A model
    that takes `text_input` (the vLLM backend's interface) is replayed generatively: each row streamed
    over HTTP with `prompts` (default: the tiny model's words; tuner.replay._generate), whatever
    `settings.protocol` says. `cut_below_tokens_per_s` (generative, one load-generator process): at the
    measured window's end, when the engine streamed fewer output tokens per second over the window than
    that (`tuner.measurement_tokens`' streamed rate), the streams still open are cut rather than waited
    for (`ReplayResult.cut`; their records' `cut`). Raises ServerSetupError (unreachable server, model not loaded), TrafficError
    (shapes that do not fit the model), ReplayError (the load generator failed)."""
    warmup_s = settings.warmup_s if warmup_s is None else warmup_s
    metadata, config = _plan.model_info(endpoints.http, model)
    if "timestamp" not in traffic.columns:
        raise TrafficError("traffic has no 'timestamp' column")
    if not traffic["timestamp"].is_monotonic_increasing:
        traffic = traffic.sort_values("timestamp", kind="stable")
    due = due_offsets(traffic, speed)
    if duration_s is not None:
        keep = due < duration_s
        traffic, due = traffic[keep], due[keep]
    if len(due) == 0:
        raise TrafficError("traffic has no requests to replay")
    generative = _generate.is_generative_model(config)
    if generative:
        plan = _generate.plan_generate(config, traffic, prompts)
    else:
        plan = _plan.plan_requests(metadata, config, traffic)  # its errors name the traffic's own row labels
    protocol = "http" if generative else settings.protocol
    stats = _mid_replay(stats or (lambda: _plan.statistics(endpoints.http, model)))
    calibration = calibrate(protocol) if settings.workers == 0 else cached_calibration(protocol)
    peak_rps = _plan.peak_rate(due)
    end_s = float(due[-1] if duration_s is None else duration_s)
    cut = None
    if generative and cut_below_tokens_per_s is not None and end_s > warmup_s:
        cut = {"start_s": warmup_s, "end_s": end_s, "tokens": cut_below_tokens_per_s * (end_s - warmup_s)}
    workers, reason = choose_workers(
        settings.workers, peak_rps, cpus=available_cpus(),
        per_process_rps=calibration.per_process_rps if calibration else float("inf"))

    with owned_temporary_dir(REPLAY_PREFIX) as tmp:
        outcome = run_load_generator(
            tmp, protocol=protocol,
            url=endpoints.grpc if protocol == "grpc" else endpoints.http,
            plan=plan.to_json(), due=due, shape_ids=plan.shape_ids, workers=workers,
            max_in_flight=settings.max_in_flight, request_timeout_s=settings.request_timeout_s,
            warmup_s=warmup_s, stats=stats, progress=progress, watch=watch, watch_every_s=watch_every_s,
            cut=cut)
    summaries = outcome.summaries
    wall = max((s["wall_s"] for s in summaries), default=0.0) or 1.0
    return ReplayResult(
        records=outcome.records, stats_before=outcome.stats_before, stats_after=outcome.stats_after,
        speed=speed, warmup_s=warmup_s, duration_s=end_s,
        mode="local" if workers == 1 else "distributed", workers=workers, reason=reason,
        load_generator_cpu=sum(s["cpu_s"] for s in summaries) / wall,
        details={"processes": summaries, "t0_monotonic": outcome.t0,
                 "plan_shapes": len(plan.requests if generative else plan.shapes),
                 "locust": outcome.locust},
        calibration=calibration, peak_rps=peak_rps, stopped=outcome.stopped, generative=generative,
    )


def _mid_replay(stats: Stats) -> Stats:
    """Statistics taken during the replay: a server that stops answering then has died or hung
    (ServerError, exit 1), which is not the user's input (the setup was checked before the start)."""
    def snapshot() -> dict:
        try:
            return stats()
        except InputError as exc:
            raise ServerError(f"the server stopped answering during the replay: {exc}") from None
    return snapshot
