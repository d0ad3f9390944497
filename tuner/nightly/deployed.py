"""Production's configuration, as a night measures it and proposes a change to it.

An encoder's is its config.pbtxt: the dynamic batcher's knobs, scored in requests per dollar. A model
vLLM serves (`engineargs.is_vllm_model`) batches inside its engine, so its configuration is its engine
arguments: production's model.json with vLLM's values for what it leaves out (as `tuner tune`'s
incumbent), searched in the study's engine knobs, every replay streamed and scored in output tokens per
dollar, and a proposal is production's model.json with only the tuned knobs changed.

    study_for_model(study)                the study held to its model's kind (its space, its SLA)
    read_deployed(study, production)      production's `Deployed`: the config.pbtxt served, the tuned
                                          knobs' values, a vLLM-backend model's engine arguments
    Deployed.proposal(candidate, search)  the proposed file, its text and its diff against production's
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from tuner import modelconfig, space
from tuner.errors import ConfigError
from tuner.files import read_json_object
from tuner.llm import engineargs
from tuner.modelconfig import ModelConfig
from tuner.settings import StudySettings, check_generative
from tuner.study import is_vllm_study

CONFIG_FILE = "config.pbtxt"


@dataclass(frozen=True)
class Proposal:
    """The file a change proposes: its name (config.pbtxt or model.json), its text, its diff from production's."""

    name: str
    text: str
    diff: str
    changed: tuple[str, ...]  # "knob: old -> new", one per tuned knob that moved


@dataclass(frozen=True, kw_only=True)
class Deployed:
    """Production's configuration: its file, the config.pbtxt the server loads, the tuned knobs' values."""

    path: Path                  # production's file: its config.pbtxt, or a vLLM-backend model's model.json
    config: ModelConfig         # the config.pbtxt the server loads
    params: dict                # production's values of the tuned knobs (the search's reading)
    engine: dict | None = None  # a vLLM-backend model's engine arguments, as its model.json holds them

    @property
    def unit(self) -> str:
        """What a score counts per dollar: "tokens" (output tokens) for a model vLLM serves, else "requests"."""
        return "requests" if self.engine is None else "tokens"

    def proposal(self, candidate: dict, search) -> Proposal:
        """Production's file with only the candidate's tuned knobs changed, and the diff."""
        if self.engine is None:
            proposed = space.apply(self.config, candidate, search)
            modelconfig.validate(proposed, "proposed config")
            written = self.path.read_text()
            text = modelconfig.to_text(proposed, comments_from=written)
            # against production's file as written (its comments, its layout): a diff `patch` applies to it
            diff = space.config_diff(written, text, old_name=f"production/{self.path.name}",
                                     new_name=f"proposed/{CONFIG_FILE}", as_written=True)
            changed = tuple(modelconfig.changed_fields(self.config, proposed))
            return Proposal(CONFIG_FILE, text, _lines(diff), changed)
        # as tune's recommended/model.json (tuner.export.recommended_engine): production's arguments,
        # only the tuned knobs written in, checked as vLLM would
        args = space.apply_engine(self.engine, space.split(candidate)[1])
        text = json.dumps(args, indent=2) + "\n"
        diff = space.engine_diff(self.engine, args, old_name=f"production/{self.path.name}",
                                 new_name=f"proposed/{engineargs.ENGINE_FILE}")
        changed = tuple(f"{key}: {json.dumps(self.engine.get(key))} -> {json.dumps(value)}"
                        for key, value in args.items() if self.engine.get(key) != value)
        return Proposal(engineargs.ENGINE_FILE, text, _lines(diff), changed)


def _lines(diff) -> str:
    return "".join(line + "\n" for line in diff)


def study_for_model(study: StudySettings) -> StudySettings:
    """The study held to its model's kind, as `tuner tune` holds it: a vLLM-backend model's searches its
    engine knobs only and limits TTFT/TPOT; an encoder's searches the dynamic batcher (SettingsError in
    one line for a knob or a limit of the other kind)."""
    generative = is_vllm_study(study)
    check_generative(study, generative=generative)
    return dataclasses.replace(study, search=space.study_space(study.search, vllm=generative,
                                                               source=study.source or "<study>"))


def read_deployed(study: StudySettings, production: str | Path | None) -> Deployed:
    """Production's configuration. `production` (the nightly YAML's) names its config.pbtxt, or for a
    vLLM-backend model its model.json (or its config.pbtxt, the model.json of that model's directory
    read); default: the study model's own files."""
    model_dir = Path(study.model_repository) / study.model
    given = Path(production) if production else None
    if not is_vllm_study(study):
        path = given or model_dir / CONFIG_FILE
        config = modelconfig.load(path)
        _check_production(config, path, study)
        space.check_tunable(config, str(path), search=study.search)
        params = space.from_config(config, study.search)
        space.check_choices(params, study.search, whose="production's")
        return Deployed(path=path, config=config, params=params)
    if given is not None and given.suffix.lower() == ".json":
        config_path, path = model_dir / CONFIG_FILE, given
        engine = read_json_object(given, missing="no such file (production's model.json)", error=ConfigError)
        engineargs.check(engine, source=str(given))
    else:  # production's config.pbtxt (or the study's): its model directory holds the model.json
        config_path = given or model_dir / CONFIG_FILE
        path = engineargs.version_dir(config_path.parent) / engineargs.ENGINE_FILE
        engine = engineargs.read(config_path.parent)
    config = modelconfig.load(config_path)
    _check_production(config, config_path, study)
    resolved = engineargs.resolved(engine, engineargs.device_class(study.cost.gpu))
    params = space.from_config(config, study.search, engine=resolved)
    space.check_choices(params, study.search, whose="production's")
    return Deployed(path=path, config=config, params=params, engine=engine)


def _check_production(config: modelconfig.ModelConfig, path: Path, study: StudySettings) -> None:
    """What Triton would refuse, or what would measure another model, in one line before any server: a
    config breaking Triton's rules, or one naming another model than the study's (Triton refuses to load
    it from the study model's directory, and every trial would fail)."""
    modelconfig.validate(config, str(path))
    if config.name and config.name != study.model:
        raise ConfigError(f"{path}: names model {config.name!r}, not the study's {study.model!r}: production's "
                          "config must be the study model's")
