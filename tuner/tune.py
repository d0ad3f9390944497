"""`tuner tune` as a library call: check the inputs, run the study, write its outputs and report.

The one place the whole flow is wired: evaluation (server + replay) -> search -> export -> report.
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

from tuner import evaluate, export, modelconfig, search
from tuner.cost import price_for
from tuner.errors import TunerError
from tuner.report import write_report
from tuner.traffic import mean_rps, peak_rps


def tune(settings, trials: int, timeout_s: float | None = None, storage: str | None = None,
         workers: int = 1, progress: bool = True) -> dict:
    """Check the inputs (exit 2 before any server starts), run the study, write its outputs."""
    base = evaluate.base_config(settings)
    base_path = Path(settings.model_repository) / settings.model / "config.pbtxt"
    modelconfig.validate(base, str(base_path))
    traffic = evaluate.study_traffic(settings)
    price = price_for(settings.cost)
    url = search.storage_url(settings, storage)
    Path(settings.output).mkdir(parents=True, exist_ok=True)
    metadata = {
        "scoring": settings.scoring,
        "model": settings.model,
        "study_file": settings.source,
        "storage": url,
        "base_config": modelconfig.to_text(base),
        "base_config_source": base_path.read_text(),  # as the user wrote it: its comments go on
        "preferred_batch_size": settings.search.preferred_batch_size,
        "sla": dataclasses.asdict(settings.sla),
        "traffic": {**dataclasses.asdict(settings.traffic), "requests": len(traffic),
                    "peak_rps": peak_rps(traffic, settings.traffic.speed),
                    "mean_rps": mean_rps(traffic)},
        "price": price.as_dict(),
    }
    open_evaluation = functools.partial(evaluate.session, settings, str(Path(settings.output) / "server"))
    study, remeasured = search.tune(settings, open_evaluation, url, n_trials=trials, timeout_s=timeout_s,
                                    workers=workers, incumbent=evaluate.incumbent_params(base, settings.search),
                                    metadata=metadata, progress=progress)
    summary = export.write_outputs(study, settings.output)
    if remeasured:  # None when a resumed study had nothing new: the records of its last run stand
        export.write_latency_records(remeasured, settings.output)
    try:
        summary["report"] = str(write_report(settings.output))
    except TunerError as exc:  # the study's outputs stand without the report; say why it is missing
        summary["report_error"] = str(exc)
    return summary
