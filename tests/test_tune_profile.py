"""The model strategy's profile in `tuner tune`: what it was measured on (`study.model_digest`, kept in
the profile), where `tune --check` says it comes from, its progress, and the ranking made with the profile
as written (the one `tuner simulate --profile` reads)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from tests.support import FakeLauncher
from tuner import tune as tune_module
from tuner.cli import main
from tuner.settings import read_study
from tuner.simulate import Profile, read_profile, write_profile
from tuner.study import base_config, model_digest, stale_profile

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def study(tmp_path) -> Path:
    """A model-strategy study of a copy of encoder_sim (the test changes its files), on a few seconds of
    Poisson traffic."""
    shutil.copytree(ROOT / "model_repository_templates" / "encoder_sim", tmp_path / "repo" / "encoder_sim",
                    ignore=shutil.ignore_patterns("__pycache__"))
    rng = np.random.default_rng(0)
    pd.DataFrame({"timestamp": np.cumsum(rng.exponential(1 / 30, 600)),
                  "seq_len": rng.integers(16, 128, 600)}).to_csv(tmp_path / "traffic.csv", index=False)
    (tmp_path / "study.yaml").write_text(yaml.safe_dump({
        "name": "prof", "model_repository": "repo", "model": "encoder_sim",
        "traffic": {"path": "traffic.csv"}, "sla": {"latency_ms": 100},
        "cost": {"price_per_hour": 3.6}, "output": "out",
        "search": {"strategy": "model", "max_batch_size": {"low": 1, "high": 16, "log": True},
                   "max_queue_delay_microseconds": {"low": 0, "high": 2000, "step": 1000}},
    }))
    return tmp_path / "study.yaml"


def _profile(digest: str = "", scale: float = 1.0) -> Profile:
    return Profile.from_function(lambda r, n: scale * (1.0 + r * n / 97.0), rows=[1, 2, 4, 8, 16],
                                 lengths=[16, 64, 128], model="encoder_sim", model_digest=digest)


def test_the_model_digest_follows_what_the_model_computes_with_not_its_batching(study):
    settings = read_study(study)
    base = base_config(settings)
    digest = model_digest(settings, base)
    batching = base_config(settings)
    batching.max_batch_size = 3
    batching.dynamic_batching.max_queue_delay_microseconds = 777
    batching.instance_group[0].count = 4
    assert model_digest(settings, batching) == digest  # what a trial or the profile sets itself
    slower = base_config(settings)
    next(iter(slower.parameters.values())).string_value += "1"
    assert model_digest(settings, slower) != digest  # a parameter of the model (encoder_sim's time_scale)
    code = study.parent / "repo" / "encoder_sim" / "1" / "model.py"
    code.write_text(code.read_text() + "\n# changed\n")
    assert model_digest(settings, base) != digest  # its code


def test_a_profile_keeps_its_digest_and_one_of_another_version_is_said(study, tmp_path):
    settings = read_study(study)
    base = base_config(settings)
    digest = model_digest(settings, base)
    path = write_profile(_profile(digest), tmp_path / "p.csv")
    assert f"# model_digest: {digest}\n" in path.read_text() and read_profile(path).model_digest == digest
    assert stale_profile(digest, settings, base, where="p.csv") is None
    assert stale_profile("", settings, base, where="p.csv") is None  # by hand, or an older tuner's: unknown
    note = stale_profile("0123456789abcdef", settings, base, where="p.csv")
    assert note.startswith("p.csv was measured on another version of encoder_sim")


def test_tune_check_says_where_the_profile_comes_from(study, capsys):
    settings = read_study(study)
    digest = model_digest(settings, base_config(settings))
    out = study.parent / "out"

    def said() -> str:
        assert main(["tune", str(study), "--check"]) == 0
        row = [line for line in capsys.readouterr().out.splitlines() if line.startswith("search")]
        return row[0]

    assert "profile measured first (OUTPUT/profile.csv)" in said()
    out.mkdir()
    write_profile(_profile(digest), out / "profile.csv")  # `tuner profile STUDY` wrote it there
    assert f"profile {out / 'profile.csv'} (measured before; remove it to measure again)" in said()
    write_profile(_profile("0123456789abcdef"), out / "profile.csv")  # then model.py changed
    assert f"profile measured again ({out / 'profile.csv'} is another version of the model's)" in said()


def test_tune_ranks_with_the_profile_as_written_and_measures_a_stale_one_again(study, monkeypatch):
    """The ranking is made with the profile read back from OUTPUT/profile.csv (6 significant digits), as
    `tuner simulate --profile` ranks it, not with the in-memory one: the two tie-broke differently. A
    profile of another version of the model in the output is measured again, with a note."""
    import tuner.profiler
    import tuner.server
    from tuner import search
    from tuner.profiler import ProfileRun

    settings = read_study(study)
    digest = model_digest(settings, base_config(settings))
    measured = []

    def fake_measure(launcher, s, traffic, **kw):
        measured.append(kw["on_progress"])
        return ProfileRun(profile=_profile(digest, scale=1.000001234567), samples=(), rows=(), lengths=(),
                          max_batch_size=16, warmup=None, seconds=0.0)

    ranked = []
    real_space = search.model_space

    def spy(s, **kw):
        ranked.append(kw["profile"])
        return real_space(s, **kw)

    monkeypatch.setattr(tuner.server, "make_launcher", lambda *a, **k: FakeLauncher())
    monkeypatch.setattr(tuner.profiler, "measure_profile", fake_measure)
    monkeypatch.setattr(search, "model_space", spy)

    class Notes(tune_module.Progress):
        def __init__(self):
            self.lines = []

        def note(self, text):
            self.lines.append(text)

    p = tune_module.prepare(settings)
    out = Path(settings.output)
    tune_module._simulate(p, Notes())
    assert len(measured) == 1 and measured[0] is not None  # its progress reaches the bars
    assert ranked[-1] == read_profile(out / "profile.csv") and ranked[-1] != _profile(digest, scale=1.000001234567)
    notes = Notes()
    tune_module._simulate(p, notes)  # measured before, of this model: used as it is
    assert len(measured) == 1 and any("measured before" in line for line in notes.lines)
    # 20 s of traffic: the fastest configurations' capacity searches run out of it, as simulate says
    assert any("reached the end of the traffic" in line for line in notes.lines), notes.lines
    write_profile(_profile("0123456789abcdef"), out / "profile.csv")
    notes = Notes()
    tune_module._simulate(p, notes)
    assert len(measured) == 2 and any("was measured on another version of encoder_sim" in line and
                                      line.endswith("measuring it again") for line in notes.lines), notes.lines
    assert read_profile(out / "profile.csv").model_digest == digest


def test_the_bars_show_the_profiles_points_and_never_go_back():
    from tuner.cli._progress import Bars

    bars = Bars(enabled=True)
    bars.profile_point(1, 40, "1 x 16")
    assert (bars.bar.desc, bars.bar.n, bars.bar.total) == ("profile", 1, 40)
    bars.profile_point(9, 30, "8 x 128")  # the total counted at its most falls once known
    assert (bars.bar.n, bars.bar.total) == (9, 30)
    bars.close()
    quiet = Bars(enabled=False)
    quiet.profile_point(1, 40, "1 x 16")
    assert quiet.bar is None
