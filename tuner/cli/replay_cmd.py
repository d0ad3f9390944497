"""`tuner replay STUDY.yaml`: replay the study's traffic once against one configuration and measure."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from typing import TYPE_CHECKING

from tuner import space
from tuner.cli._args import (
    Number,
    add_assignments,
    add_command,
    add_flag,
    add_input,
    add_json,
    add_numbers,
    add_output_file,
    add_quiet,
    add_study,
)
from tuner.errors import SettingsError
from tuner.files import check_writable, json_safe, json_with_keys, write_atomic
from tuner.settings import read_study

if TYPE_CHECKING:
    from collections.abc import Callable

    from tuner.measurement import Measurement, Served
    from tuner.score import SlaCheck
    from tuner.settings import SlaSettings


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `tuner replay` to `subparsers`."""
    p = add_command(
        subparsers,
        "replay",
        run=_replay,
        help="replay the study's traffic against one configuration and print the measurement",
        description="Start (or attach to) the study's Triton server, load the model's config.pbtxt "
        "from the repository with the --set fields changed, replay the study's traffic open loop "
        "(each request leaves at its due time; latency counts from the due time) and print latency "
        "percentiles, throughput, errors, send lag, Triton's batching figures and whether the study's SLA "
        "held for the window (as a search step judges it). Each traffic row "
        "becomes one request: batch_size (default 1) is the first dim of a batching model, a "
        "'<INPUT>:<k>' column gives dim k of that input, else a 'seq_len' column gives every "
        "variable dim. --json replaces only a measurement tuner wrote (else --force), never one of the "
        "study's inputs. Exits 1 when no measured request succeeded.",
    )
    add_study(p, "the study file (server, model, traffic, replay)")
    add_input(p, "--config", metavar="PATH", what="a config.pbtxt",
              help="replay against this config.pbtxt (a vLLM-served model: this model.json), e.g. a tune's "
                   "OUTPUT/recommended/config.pbtxt, instead of the repository's; --set changes it further")
    add_assignments(p, "change a config field for this replay, e.g. --set max_batch_size=8 "
                    "--set max_queue_delay_microseconds=2000 (repeatable)")
    add_numbers(p, (
        Number("--speed", "S",
               "replay speed (default: the study's traffic.speed); 2 = twice the recorded rate"),
        Number("--duration", "S", "measure only S seconds of the replayed schedule (after the warm-up)"),
        Number("--warmup", "S", "replay S seconds of the traffic before what is measured (default: the "
               "study's replay.warmup_s; a generative tune's check-it line gives its capacity steps' own)"),
    ))
    p.add_argument("--step", action="store_true",
                   help="replay what one step of the study's search replays at this speed: the busiest "
                        "search.capacity.step_duration_s of the traffic, after replay.warmup_s of what came "
                        "before it (to check a trial's figure again, e.g. at its reported capacity)")
    p.add_argument("--protocol", choices=("http", "grpc"), default=None, help="override replay.protocol")
    p.add_argument("--workers", type=int, default=None, metavar="N",
                   help="Locust processes (0 = decide from the offered rate; default: the study's)")
    add_json(p, "the measurement")
    add_output_file(p, flags=("--records",), metavar="OUT", label="--records {path}",
                    help="also write every request replayed to OUT (.csv or .parquet), a row each: the replay "
                         "it was in (a retry, a repeat), whether the figures count it (due after the warm-up), "
                         "its position in the replayed schedule, due / send / end times (s from the replay's "
                         "start), latency from its due time, send lag, ok and error; a generative replay adds "
                         "its tokens asked and received and its first and last token times")
    add_flag(p, "--force", "replace a --json or --records file that tuner did not write (the study's own "
             "inputs are never replaced)")
    add_quiet(p)


def _replay(args: argparse.Namespace) -> int:
    # Imported here: `tuner --help` need not load the server and traffic stacks.
    from tuner.server import make_launcher
    from tuner.server.remote import check_remote
    from tuner.study import study_traffic
    from tuner.trial.step import make_probe
    from tuner.trial.warmup import warm_up

    settings = read_study(args.study)
    speed = settings.traffic.speed if args.speed is None else args.speed
    if speed <= 0:
        raise SettingsError(f"--speed: must be > 0, got {args.speed}")
    if args.duration is not None and args.duration <= 0:
        raise SettingsError(f"--duration: must be > 0, got {args.duration}")
    if args.step and args.duration is not None:
        raise SettingsError("--step and --duration: choose one (a step lasts the study's "
                            "search.capacity.step_duration_s)")
    if args.workers is not None and args.workers < 0:
        raise SettingsError(f"--workers: must be >= 0, got {args.workers}")
    if args.warmup is not None and args.warmup < 0:
        raise SettingsError(f"--warmup: must be >= 0, got {args.warmup:g}")
    if args.json:
        from tuner.cli.simulate_cmd import check_output

        check_writable(args.json, label=f"--json {args.json}")  # before minutes of replay, not after
        check_output(args.json, settings, label=f"--json {args.json}", force=args.force, ours=_is_replay)
    if args.records:
        _check_records(args.records, settings, force=args.force)
    settings = dataclasses.replace(settings, replay=dataclasses.replace(
        settings.replay,
        protocol=args.protocol or settings.replay.protocol,
        workers=settings.replay.workers if args.workers is None else args.workers,
        warmup_s=settings.replay.warmup_s if args.warmup is None else args.warmup,
    ))
    params = space.parse_assignments(args.assignments)
    if _is_generative(settings):
        return _replay_generate(settings, params, speed=speed, args=args)
    config = _config(settings, params, args.config)
    traffic = study_traffic(settings)
    from tuner.study import base_config
    from tuner.tune import ignored_column_notes

    for note in ignored_column_notes(settings, config if config is not None else base_config(settings), traffic):
        print(f"note: {note}", file=sys.stderr)  # a column the requests do not take, said as tune says it
    windows = _windows(traffic, settings, args=args, speed=speed)
    if settings.server.launcher == "remote":  # Triton's HTTP endpoint, not its metrics or gRPC port
        check_remote(settings.server.url, [settings.model])  # what its launcher refuses, before any replay
    say = []

    with make_launcher(settings) as launcher:
        running = launcher.apply_config(settings.model, config) if config is not None else \
            launcher.model_config(settings.model)
        warm = None
        if settings.measurement.warmup:  # as a trial is measured: on a server at steady state
            warm = warm_up(launcher, settings, traffic, max_batch_size=int(running.max_batch_size))
            print(f"warm-up: {warm.seconds:.1f} s, {warm.sweep_requests} shape requests, "
                  + (f"steady (windows: {warm.seen})" if warm.stable else
                     f"FAILING, not slow: {warm.reason}" if warm.failing else f"NOT steady: {warm.reason}")
                  + (f"; {warm.failures()} (not judged: the measured window is)" if warm.errors else ""), file=sys.stderr)
        replays = []
        probe = make_probe(launcher, settings, windows, max_batch_size=int(running.max_batch_size),
                           progress=not args.quiet,
                           on_measure=say.append, on_replay=replays.append)
        m = probe(speed)
    print(f"replay: {settings.model} at speed {speed:g}{_what(settings, traffic, step=args.step, speed=speed)}, "
          f"{m.workers} Locust process{'es' if m.workers > 1 else ''}"
          + (f", {m.attempts} attempts (the send lag broke its budget)" if m.attempts > 1 else ""))
    from tuner.score import check_sla

    verdict = sla_verdict_row(m, settings.sla, check_sla)
    print(format_measurement(m, settings.sla.percentile, verdict=verdict))
    if args.json:
        figures = {k: v for k, v in dataclasses.asdict(m).items() if k != "latencies_ms"}
        if m.max_batch_size <= 0:
            figures["fill_rate"] = None  # not 1.0: a model without batching has no fill rate
        data = {"measurement": figures, "workers": m.workers, "attempts": m.attempts,
                "warmup": dataclasses.asdict(warm) if warm is not None else None,
                "config": _config_path(args),
                "params": {k: list(v) if isinstance(v, tuple) else v for k, v in params.items()},
                # what the server ran, read back from it: the measurement says which configuration it is of
                "running": space.deployed(running),
                "sla": _sla_json(m, settings.sla, check_sla, row=verdict)}
        write_atomic(args.json, json.dumps(json_safe(data), indent=2) + "\n", label=f"--json {args.json}")
    if args.records:
        _write_records(args.records, replays)
    return _exit_code(m, m.first_error)


def _config_path(args: argparse.Namespace) -> str | None:
    """The --config file replayed, as given; None for the repository's (or the server's own) config."""
    return None if args.config is None else str(args.config)


def _is_replay(path) -> bool:
    """Whether `path` holds a measurement `tuner replay --json` wrote (either kind of model's)."""
    return json_with_keys(path, {"measurement", "params"})


def _config(settings, params: dict, path):
    """The config.pbtxt to load before the replay: `path`'s (--config) or the repository's, with the --set
    `params`; None (replay what the server runs) when neither is given."""
    from tuner import modelconfig
    from tuner.study import base_config, config_file

    if path is None and not params:
        return None
    base = base_config(settings)
    config = space.apply(config_file(path, like=base) if path is not None else base, params)
    if path is not None:
        modelconfig.validate(config, str(path))
    return config


def _windows(traffic, settings, *, args: argparse.Namespace, speed: float):
    """What the replay sends at `speed` (a search step's window with --step, else the traffic from its start,
    cut to --duration), refused before a server starts when its measured part holds no request."""
    from tuner.trial.step import check_measured, step_windows, whole_traffic

    # --step --warmup: as a generative trial's capacity step, its warm-up made whole with the stretch itself
    # where the traffic before it is shorter (tuner.trial.generate.make_settled_probe)
    windows = step_windows(traffic, settings, fill=args.warmup is not None) if args.step else \
        whole_traffic(traffic, settings.replay.warmup_s, args.duration)
    check_measured(windows, speed, source=str(settings.traffic.path),
                   hint="a lower --speed, or a shorter replay.warmup_s")
    if args.duration is not None:
        from tuner.traffic import due_offsets

        part, warmup, _end = windows(speed)
        held = float(due_offsets(part, speed)[-1]) - warmup
        if args.duration > held:
            print(f"note: --duration {args.duration:g}: the traffic holds {held:.3g} s after its warm-up at speed "
                  f"{speed:g}; that is what is replayed", file=sys.stderr)
    return windows


def _what(settings, traffic, *, step: bool, speed: float) -> str:
    """What the replay measured, when it is not the traffic from its start: a step's busiest stretch, or
    the whole traffic where it is no longer than a step at this speed (a step replays all of it then)."""
    from tuner.traffic import fits_one_step

    if not step:
        return ""
    measured_s, warmup_s = settings.search.capacity.step_duration_s, settings.replay.warmup_s
    if fits_one_step(traffic, speed, warmup_s, measured_s=measured_s):
        return (f", one search step (the whole traffic after its warm-up: at this speed it lasts no longer than a "
                f"step's {warmup_s:g} s of warm-up and {measured_s:g} s)")
    return f", one search step (the busiest {measured_s:g} s of the traffic)"


def _is_generative(settings) -> bool:
    """Whether the study's model generates text: it takes `text_input` (the vLLM backend's interface)."""
    from tuner.study import base_config

    return any(i.name == "text_input" for i in base_config(settings).input)


def _replay_generate(settings, params: dict, *, speed: float, args: argparse.Namespace) -> int:
    """`tuner replay` of a generative model: the trial's engine arguments applied, the token traffic
    streamed, and the replay's figures set beside the engine's own."""
    from pathlib import Path

    from tuner.llm import engineargs
    from tuner.score import check_tokens
    from tuner.server import make_launcher
    from tuner.server.remote import check_remote
    from tuner.study import base_config, engine_file, study_traffic
    from tuner.traffic import mean_output_tps
    from tuner.trial.generate import check_context, keeping_up, load_check, replay_generate

    config_params, engine_params = space.split(params)
    if config_params:
        raise SettingsError(f"--set {next(iter(config_params))}: Triton's dynamic batcher does nothing on a "
                            "vLLM-backend model (vLLM handles the batching); set its engine knobs "
                            f"({', '.join(space.ENGINE_NAMES)})")
    base = base_config(settings)
    model_dir = Path(settings.model_repository) / settings.model
    vllm = engineargs.is_vllm_model(model_dir, base)
    if engine_params and not vllm:
        raise SettingsError(f"--set {next(iter(engine_params))}: {settings.model} is not a vLLM-backend model "
                            "(no model.json of engine arguments)")
    if args.config is not None and not vllm:
        raise SettingsError(f"--config {args.config}: {settings.model} streams but is not a vLLM-backend model "
                            "(no model.json of engine arguments to replace)")
    engine_args = None  # None: the engine runs the model's own model.json
    if args.config is not None or engine_params:
        own = engine_file(args.config) if args.config is not None else engineargs.read(model_dir)
        engine_args = space.apply_engine(own, engine_params)
    ran = (engine_args or engineargs.read(model_dir)) if vllm else None  # the engine arguments replayed
    traffic = study_traffic(settings)
    if vllm:
        context = engineargs.context_tokens(ran)
        if context is not None:
            check_context(traffic, context, model=settings.model)
    part, warmup, end = _windows(traffic, settings, args=args, speed=speed)(speed)
    if settings.server.launcher == "remote":
        check_remote(settings.server.url, [settings.model])  # what its launcher refuses, before any replay
    with make_launcher(settings) as launcher:
        if engine_args is not None:
            launcher.apply_engine_args(settings.model, base, engine_args)
        run = replay_generate(launcher, settings, part, speed=speed, warmup_s=warmup,
                              duration_s=None if end is None else end - warmup, progress=not args.quiet)
    m = run.measurement
    print(f"replay: {settings.model} at speed {speed:g}{_what(settings, traffic, step=args.step, speed=speed)}, {m.requests} requests streamed, "
          f"{m.workers} Locust process{'es' if m.workers > 1 else ''}")
    # the rule tune judges the same window by: a step's (it also fails an engine fallen behind), else the
    # load's (the same, unless the window is too short to tell: load_check)
    check = (keeping_up(check_tokens, tokens_per_s=mean_output_tps(traffic)) if args.step
             else load_check(check_tokens, m, tokens_per_s=mean_output_tps(traffic)))
    verdict = sla_verdict_row(m, settings.sla, check)
    print(format_generate(run, settings.sla.percentile, average_tokens_per_s=speed * mean_output_tps(traffic),
                          verdict=verdict))
    if args.json:
        from tuner.llm.engine_watch import batch_figures

        engine = _engine_figures(run.engine)
        if engine is not None:  # the peaks sampled while the replay ran (its gauges' last values are the idle end's)
            engine.update({k: v for k, v in batch_figures(run.stretch).items() if k.endswith("_peak")})
        data = {"measurement": _figures(m), "all_requests": _figures(run.whole),
                "engine": engine, "config": _config_path(args),
                "params": {k: list(v) if isinstance(v, tuple) else v for k, v in params.items()},
                "engine_args": ran, "sla": _sla_json(m, settings.sla, check, row=verdict)}
        write_atomic(args.json, json.dumps(json_safe(data), indent=2) + "\n", label=f"--json {args.json}")
    if args.records:
        _write_records(args.records, [run.replay] if run.replay is not None else [])
    return _exit_code(m, run.first_error)


def _records_parquet(path) -> bool:
    """Whether a --records file is Parquet (else CSV): the suffixes traffic files take (tuner.traffic.io)."""
    from pathlib import Path

    from tuner.traffic.io import PARQUET_SUFFIXES

    return Path(path).suffix.lower() in PARQUET_SUFFIXES


def _check_records(path, settings, *, force: bool) -> None:
    """Refuse, before the replay, a --records file of another format, or one that would replace a file
    tuner did not write (unless --force) or one of the study's inputs."""
    from pathlib import Path

    from tuner.cli.simulate_cmd import check_output
    from tuner.errors import OutputError
    from tuner.traffic.io import CSV_SUFFIXES

    label = f"--records {path}"
    if not (_records_parquet(path) or Path(path).suffix.lower() in CSV_SUFFIXES):
        raise OutputError(f"{label}: a .csv or .parquet file (the format follows the name)")
    check_writable(path, label=label)
    check_output(path, settings, label=label, force=force, ours=_is_records)


def _is_records(path) -> bool:
    """Whether `path` holds requests `tuner replay --records` wrote (its first columns are the table's)."""
    import pandas as pd
    import pyarrow.parquet as pq

    from tuner.replay import RECORDS_FRONT

    try:
        names = pq.read_schema(path).names if _records_parquet(path) else list(pd.read_csv(path, nrows=0).columns)
    except (OSError, ValueError, UnicodeDecodeError):  # pyarrow's and pandas' errors for a file of another kind
        return False
    return names[:len(RECORDS_FRONT)] == RECORDS_FRONT


def _write_records(path, replays: list) -> None:
    """--records: every request of `replays` (tuner.replay.records_table), in the name's format, whole or
    not at all."""
    from tuner.files import replacing
    from tuner.replay import records_table

    table = records_table(replays)
    with replacing(path, label=f"--records {path}") as tmp:
        (table.to_parquet if _records_parquet(path) else table.to_csv)(tmp, index=False)
    print(f"records: {len(table)} requests of {len(replays)} replay{'s' if len(replays) != 1 else ''} -> {path}",
          file=sys.stderr)


def _exit_code(m: Served, first_error: str) -> int:
    """0 for a replay that measured, whatever its figures (the table says them); 1, with a line saying
    so, where no measured request succeeded: a script running the replay learns that nothing was served."""
    from tuner.measurement import error_line

    if m.requests and m.errors == m.requests:
        print(f"tuner replay: every one of the {m.requests} measured requests failed"
              + (f"; the first: {error_line(first_error)}" if first_error else ""), file=sys.stderr)
        return 1
    return 0


def _figures(m) -> dict:
    from tuner.measurement_tokens import PER_REQUEST

    return {k: v for k, v in dataclasses.asdict(m).items() if k not in PER_REQUEST}


def _engine_figures(engine) -> dict | None:
    if engine is None:
        return None
    from tuner.llm.engine_metrics import E2E, ITL, TPOT, TTFT

    out = {k: v for k, v in dataclasses.asdict(engine).items() if k != "histograms"}
    for key, name in (("ttft", TTFT), ("tpot", TPOT), ("itl", ITL), ("e2e", E2E)):
        hist = engine.seconds(name)
        if hist is not None:
            out[f"{key}_ms"] = {"mean": hist.mean() * 1e3, "p50": hist.quantile(0.5) * 1e3,
                                "p99": hist.quantile(0.99) * 1e3, "count": hist.count}
    return out


def _sla_json(m: Served, sla: SlaSettings, check: Callable[[Served, SlaSettings], SlaCheck], *, row: str) -> dict:
    """--json's SLA verdict, as the table's row says it: `held` true or false, null where the row gives
    no verdict (a replay that was not valid, a generative study that limits no token figure)."""
    return {"held": None if row.startswith("no verdict") else bool(check(m, sla).ok), "verdict": row}


def sla_verdict_row(m: Served, sla: SlaSettings, check: Callable[[Served, SlaSettings], SlaCheck]) -> str:
    """Whether the study's SLA held for the replayed window, by `check` (the rule tune judges it by:
    `tuner.score.check_sla`, a generative model's `check_tokens`), with the figures it compared, so that
    no one compares a p99 with its limit by hand; no verdict for a replay that was not valid (tune's
    "unmeasured")."""
    from tuner.measurement import percentile_key
    from tuner.measurement_tokens import TokenMeasurement

    if not m.valid:
        return f"no verdict: the replay was not valid ({m.invalid_reason})"
    if isinstance(m, TokenMeasurement) and sla.ttft_ms is None and sla.tpot_ms is None and sla.e2e_ms is None:
        # a replay measures whatever the study limits (tune holds a generative study to a token SLA)
        return "no verdict: the study limits no token figure (sla.ttft_ms, sla.tpot_ms or sla.e2e_ms)"
    c = check(m, sla)
    if not c.ok:
        return f"MISSED for this window: {c.reason or 'no request was measured'}"
    q = percentile_key(sla.percentile)
    if isinstance(m, TokenMeasurement):  # a generative model's: each token limit the SLA sets
        held = [f"{q} {name} {value(sla.percentile):.1f} ms <= {limit:g} ms"
                for name, value, limit in (("TTFT", m.ttft, sla.ttft_ms), ("TPOT", m.tpot, sla.tpot_ms),
                                           ("end to end", m.e2e, sla.e2e_ms)) if limit is not None]
    else:
        held = [f"{q} {c.latency_ms:.1f} ms <= {sla.latency_ms:g} ms"]
    return f"held for this window: {', '.join(held)}, error rate {c.error_rate:.2%} <= {sla.max_error_rate:.2%}"


def format_generate(run, sla_percentile: float = 99.0, *, average_tokens_per_s: float | None = None,
                    verdict: str | None = None) -> str:
    """A generative replay as two tables: the replay's figures, then TTFT / TPOT / ITL / end to end
    as the replay and as the engine saw the same requests. `average_tokens_per_s`: the output tokens/s
    the traffic offers on average at the replay's speed, set beside what the engine streamed;
    `verdict`: the SLA's row (`sla_verdict_row`)."""
    from tuner.llm.engine_metrics import E2E, ITL, OVERRUN_LIMIT, TPOT, TTFT
    from tuner.llm.engine_watch import batch_figures
    from tuner.measurement import error_line
    from tuner.measurement_tokens import WINDOW_LIVES, short_window
    from tuner.trial.generate import falls_behind, settled_warmup_s

    m = run.measurement
    life = settled_warmup_s(m)  # a request's mean life end to end: the streamed rate lags the window by it
    limits = "  ".join(f"{name} <= {limit:g} ms" for name, limit in (("TTFT", m.ttft_limit_ms), ("TPOT", m.tpot_limit_ms),
                                                                     ("end to end", m.e2e_limit_ms))
                       if limit is not None)
    rows = [
        ("offered", f"{m.offered_rps:.2f} req/s over {m.duration_s:.1f} s ({m.requests} requests)"),
        ("throughput", f"{m.throughput_rps:.2f} req/s, {m.output_tokens_per_s:.0f} output tokens/s, "
                       f"{m.total_tokens_per_s:.0f} tokens/s with the prompts"),
        ("goodput", f"{m.goodput_rps:.2f} req/s ({m.good_requests} requests meeting {limits or 'no limit'})"),
        ("streamed", f"{m.streamed_tokens_per_s:.0f} output tokens/s by the engine over the window (its requests "
                     f"asked for {m.offered_tokens_per_s:.0f}"
                     + (f"; the traffic offers {average_tokens_per_s:.0f} on average at this speed" if average_tokens_per_s else "")
                     + (": the engine fell behind at a rate below the average, which fails a capacity step"
                        if average_tokens_per_s and falls_behind(m, average_tokens_per_s=average_tokens_per_s) else "")
                     + (f"; a window under {WINDOW_LIVES:g}x a request's life ({life:.1f} s here) reads it low)"
                        if short_window(m.duration_s, life_s=life) else ")")),
        ("errors", f"{m.errors} ({m.error_rate:.2%})" + (f"; the first: {error_line(run.first_error)}" if run.first_error else "")),
        ("send lag", "  ".join(f"{k} {v:.3f}" for k, v in m.send_lag_ms.items()) + " ms"),
        ("valid", "yes" if m.valid else f"NO: {m.invalid_reason}"),
        *([("SLA", verdict)] if verdict else []),
        ("load generator", f"{m.load_generator_cpu:.2f} CPU cores, {m.workers} process(es)"),
    ]
    engine = run.engine
    if engine is not None:
        peaks = batch_figures(run.stretch)  # sampled while the replay ran, as a trial's are (trials.csv)
        at_peak = (f"; at its peak {peaks['running_peak']:.0f} sequences running, {peaks['waiting_peak']:.0f} waiting, "
                   f"KV cache {peaks['kv_cache_peak']:.0%} used"
                   if all(math.isfinite(peaks.get(k, math.nan)) for k in ("running_peak", "waiting_peak", "kv_cache_peak"))
                   else "")
        rows.append(("engine", f"{engine.requests:.0f} requests, {engine.generation_tokens:.0f} output tokens, "
                               f"{engine.preemptions:.0f} preemptions{at_peak}; KV cache {engine.kv_cache_usage:.0%} "
                               f"used at the end"))
        if engine.emulated_steps > 0:  # llm_sim: where the CPU was slower than the GPU it emulates
            share = engine.overrun_share
            rows.append(("emulated GPU", f"{engine.emulated_steps:.0f} engine steps, {engine.emulated_overruns:.0f} "
                                         f"({share:.1%}) ran past their emulated time on this CPU"
                                         + (": the figures are partly the CPU's (raise time_scale)"
                                            if share > OVERRUN_LIMIT else "")))
    width = max(len(name) for name, _ in rows)
    top = "\n".join(f"{name:<{width}}  {value}" for name, value in rows)

    w = run.whole
    lines = [f"{'ms, from the due time':<26} {'p50':>9} {'p99':>9} {'mean':>9}   (all {w.requests} requests sent; "
             "the engine's from its histograms, linear within a bucket: the replay's in the same buckets "
             "compares like for like)"]
    for label, figures, values, name in (("TTFT", w.ttft_ms, w.ttfts_ms, TTFT), ("TPOT", w.tpot_ms, w.tpots_ms, TPOT),
                                         ("ITL", w.itl_ms, w.itls_ms, ITL), ("end to end", w.e2e_ms, w.e2es_ms, E2E)):
        mean = float(values.mean()) if values is not None and len(values) else float("nan")
        lines.append(f"{label + ' (replay)':<26} {figures.get('p50', float('nan')):>9.2f} "
                     f"{figures.get('p99', float('nan')):>9.2f} {mean:>9.2f}")
        hist = engine.seconds(name) if engine is not None else None
        if hist is not None and hist.count > 0:
            if values is not None and len(values):
                same = hist.binned(values / 1e3)
                lines.append(f"{label + ' (replay, bucketed)':<26} {same.quantile(0.5) * 1e3:>9.2f} "
                             f"{same.quantile(0.99) * 1e3:>9.2f} {mean:>9.2f}")
            lines.append(f"{label + ' (engine)':<26} {hist.quantile(0.5) * 1e3:>9.2f} {hist.quantile(0.99) * 1e3:>9.2f} "
                         f"{hist.mean() * 1e3:>9.2f}")
    return top + "\n\n" + "\n".join(lines)


def format_measurement(m: Measurement, sla_percentile: float = 99.0, *, verdict: str | None = None) -> str:
    """The measurement as an aligned two-column table; `verdict`: the SLA's row (`sla_verdict_row`)."""
    from tuner.measurement import error_line

    rows = [
        ("offered", f"{m.offered_rps:.1f} req/s over {m.duration_s:.1f} s ({m.requests} requests)"),
        ("throughput", f"{m.throughput_rps:.1f} req/s"),
        ("errors", f"{m.errors} ({m.error_rate:.2%})" + (f"; the first: {error_line(m.first_error)}" if m.first_error else "")),
        ("latency", "  ".join(f"{k} {v:.2f}" for k, v in m.latency_ms.items()) + " ms (from due time)"),
        ("send lag", "  ".join(f"{k} {v:.3f}" for k, v in m.send_lag_ms.items()) + " ms"),
        ("valid", "yes" if m.valid else f"NO: {m.invalid_reason}"),
        *([("SLA", verdict)] if verdict else []),
        *([("repeats", _repeats(m, sla_percentile))] if m.repeats > 1 else []),
        ("executions", _executions(m)),
        ("batch size", _batch_sizes(m)),
        ("histogram", " ".join(f"{size}:{count}" for size, count in sorted(m.batch_histogram.items())) or "-"),
        ("queue", f"{m.queue_ms_mean:.2f} ms per request (mean)"),
        ("compute", f"{m.compute_ms_mean:.2f} ms per execution (mean); busy {m.busy_s:.2f} s"),
        ("load generator", f"{m.load_generator_cpu:.2f} CPU cores, {m.workers} process(es)"),
    ]
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)


def _repeats(m: Measurement, sla_percentile: float) -> str:
    """A measurement near the SLA's limit was replayed again on the same window (tuner.trial.step's
    repeat policy): the table is of the median one, not of a single replay."""
    from tuner.measurement import percentile_key

    q = percentile_key(sla_percentile)
    return (f"{m.repeats} replays of the same window (its {q} was near the SLA's limit); the median by how far "
            f"each breaks the SLA is shown (of two, the worse)")


def _executions(m: Measurement) -> str:
    """Triton's executions and the rows they ran (the histogram's), with those that succeeded where some
    failed: its inference_count counts only those, its execution_count every execution."""
    from tuner.measurement import rows_executed

    rows = rows_executed(m.batch_histogram)
    if not rows or rows == m.inference_count:
        return f"{m.execution_count} for {m.inference_count} inferences"
    return f"{m.execution_count} for {rows} rows, {m.inference_count} of them succeeded (Triton's inference_count)"


def _batch_sizes(m: Measurement) -> str:
    if m.max_batch_size <= 0:  # each request runs alone: there is no batch to fill
        return f"no batching (max_batch_size {m.max_batch_size}): one request per execution, no fill rate"
    return f"mean {m.mean_batch_size:.2f} of max {m.max_batch_size} (fill rate {m.fill_rate:.2f})"
