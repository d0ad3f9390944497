"""tuner.search's rule for the GPU types of one study's hosts, on a real Optuna storage (SQLite here; the
same rule on PostgreSQL: tests/test_postgres.py): a study keeps the rule it started with."""

from __future__ import annotations

import dataclasses

import pytest
from support import fake_settings

from tuner import search
from tuner.errors import SettingsError

L4, A100 = search.Host("l4-node-1", 1, "NVIDIA L4"), search.Host("a100-node-1", 2, "NVIDIA A100")


def _made(tmp_path, *, mixed: bool):
    settings = fake_settings(tmp_path, mixed_gpus=mixed)
    url = f"sqlite:///{tmp_path / 'study.db'}"
    search.open_study(settings, url, sampler=search.make_sampler(settings.search), identity={}, host=L4)
    return settings, url


def test_a_joining_hosts_file_cannot_allow_mixed_gpus_the_study_did_not_start_with(tmp_path):
    settings, url = _made(tmp_path, mixed=False)
    mixed = dataclasses.replace(settings, search=dataclasses.replace(settings.search, mixed_gpus=True))
    with pytest.raises(SettingsError, match="started with search.mixed_gpus: false, this study file says true"):
        search.open_study(mixed, url, sampler=search.make_sampler(mixed.search), identity={}, host=A100)
    with pytest.raises(SettingsError, match="is measured on 'NVIDIA L4' \\(its first host, l4-node-1\\)"):
        search.open_study(settings, url, sampler=search.make_sampler(settings.search), identity={}, host=A100)
    # the dry run (tune --check) says what the run will: the same refusals, nothing written
    with pytest.raises(SettingsError, match="is measured on 'NVIDIA L4'"):
        search.check_resume(settings, url, identity={}, host=A100)
    with pytest.raises(SettingsError, match="started with search.mixed_gpus: false"):
        search.check_resume(mixed, url, identity={}, host=A100)
    assert search.check_resume(settings, url, identity={}, host=L4).startswith("resumes study")


def test_a_study_started_with_mixed_gpus_takes_another_type_and_keeps_its_rule(tmp_path):
    settings, url = _made(tmp_path, mixed=True)
    search.open_study(settings, url, sampler=search.make_sampler(settings.search), identity={}, host=A100)
    single = dataclasses.replace(settings, search=dataclasses.replace(settings.search, mixed_gpus=False))
    with pytest.raises(SettingsError, match="started with search.mixed_gpus: true, this study file says false"):
        search.open_study(single, url, sampler=search.make_sampler(single.search), identity={}, host=L4)


def test_a_wait_for_another_hosts_trial_is_said_once_per_trial():
    from optuna.trial import TrialState, create_trial

    from tuner.search._loop import _say_waiting

    def running(number: int, host: str, pid: int):
        t = create_trial(state=TrialState.RUNNING, user_attrs={"host": host, "pid": pid, "gpu": "NVIDIA L4"})
        t.number = number
        return t

    said, lines = set(), []
    _say_waiting([running(2, "node-2", 753)], said, note=lines.append, grace_s=60)
    _say_waiting([running(2, "node-2", 753)], said, note=lines.append, grace_s=60)  # still waiting: not again
    _say_waiting([running(2, "node-2", 753), running(5, "node-3", 9)], said, note=lines.append, grace_s=60)
    assert lines[0] == ("waiting for trial 2 by node-2 (pid 753, NVIDIA L4): every trial ends before the "
                        "re-measurement (a host that stopped is failed 60 s after its last heartbeat, "
                        "search.grace_period_s)")
    assert len(lines) == 2 and lines[1].startswith("waiting for trial 5 by node-3 (pid 9, NVIDIA L4)")
