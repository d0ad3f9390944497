"""A generative study's baseline: the best configuration of a `tuner tune` whose summary counts output
tokens (`unit: tokens`), its output tokens/s at capacity (one server under the SLA)."""

from __future__ import annotations

from pathlib import Path

from tuner.audit import check_same_gpu
from tuner.errors import InputError
from tuner.files import read_json_object
from tuner.measurement import percentile_key
from tuner.production._engine_result import EngineBaseline
from tuner.settings import StudySettings

__all__ = ["load_engine_baseline"]


def load_engine_baseline(path: str | Path, settings: StudySettings) -> EngineBaseline:
    """The best configuration of a finished generative `tuner tune` (its output directory or
    summary.json); refused in one line when it counts requests, found no capacity, or was measured
    under another token SLA or on other traffic (the capacities would not compare)."""
    path = Path(path)
    summary_path = path if path.suffix == ".json" else path / "summary.json"
    where = f"--baseline: {summary_path}"
    summary = read_json_object(summary_path, label=where,
                               missing="not found (give the output directory of a `tuner tune`)")
    sla = summary.get("sla")
    if not isinstance(sla, dict) or not sla:
        raise InputError(f"{where}: not a tuner summary (no 'sla')")
    if summary.get("unit") != "tokens":
        raise InputError(f"{where}: a study scored in {summary.get('unit') or 'requests'}, not output tokens: "
                         f"give the output of `tuner tune` on this generative study")
    best = summary.get("best") or {}
    capacity = (best.get("at_capacity") or {}).get("output_tokens_per_s") or best.get("output_tokens_per_s")
    if not best.get("capacity_rps") or not capacity:
        raise InputError(f"{where}: that study found no configuration with a capacity under its SLA, so "
                         f"there is nothing to compare with")
    ours, theirs = settings.sla, {k: sla.get(k) for k in ("percentile", "ttft_ms", "tpot_ms", "e2e_ms")}
    if (float(theirs["percentile"] or 99), theirs["ttft_ms"], theirs["tpot_ms"], theirs["e2e_ms"]) != (
            float(ours.percentile), ours.ttft_ms, ours.tpot_ms, ours.e2e_ms):
        raise InputError(f"{where} was tuned for {_limits(theirs)}, this audit's SLA is "
                         f"{_limits(ours.__dict__)}: the capacities do not compare")
    traffic = (summary.get("traffic") or {}).get("path")
    if traffic and Path(traffic).name != Path(settings.traffic.path).name:
        raise InputError(f"{where} was tuned on {Path(traffic).name}, this audit's study replays "
                         f"{Path(settings.traffic.path).name}: the capacities do not compare")
    check_same_gpu(where, summary, settings)
    return EngineBaseline(str(summary_path), dict(best.get("params") or {}), float(capacity))


def _limits(sla: dict) -> str:
    pct = percentile_key(float(sla.get('percentile') or 99))
    given = [f"{pct} {name} <= {sla[key]:g} ms"
             for name, key in (("TTFT", "ttft_ms"), ("TPOT", "tpot_ms"), ("end to end", "e2e_ms"))
             if sla.get(key) is not None]
    return ", ".join(given) or "no token limit"
