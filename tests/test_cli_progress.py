"""The bars `tune` draws (tuner.cli._progress.Bars): a note goes on its own line, the profile bar never
goes back, the re-measure bar names what it counts (reviewer U7)."""

from __future__ import annotations

from tuner.cli._progress import Bars


def test_a_note_while_a_bar_is_open_is_on_its_own_line(capsys):
    bars = Bars(True)
    bars.remeasure(3)
    bars.remeasured_one()
    bars.note("simulation error on the 3 measured configurations")
    bars.close()
    err = capsys.readouterr().err
    assert "\ntuner: simulation error on the 3 measured configurations\n" in err.replace("\r", "\n"), repr(err)


def test_the_profile_bar_never_goes_back_and_its_total_never_falls_under_its_count():
    bars = Bars(True)
    bars.profile_point(49, 62, "a")
    bars.profile_point(50, 58, "b")
    assert (bars.bar.n, bars.bar.total) == (50, 58)
    bars.profile_point(50, 40, "c")  # a total under what is done: the count stands
    assert (bars.bar.n, bars.bar.total) == (50, 50)
    bars.profile_point(49, 50, "d")  # never back
    assert bars.bar.n == 50
    bars.close()


def test_the_remeasure_bar_counts_replays():
    bars = Bars(True)
    bars.remeasure(6)
    assert bars.bar.unit == "replay"
    bars.close()


def test_the_trials_bar_counts_every_trial_the_study_holds_even_past_what_was_planned():
    # a mixed-GPU study holds one incumbent per GPU type: 4 grid points and 2 incumbents, 5 planned
    import optuna
    from optuna.trial import TrialState, create_trial

    study = optuna.create_study()
    for _ in range(5):
        study.add_trial(create_trial(state=TrialState.COMPLETE, value=1.0))
    bars = Bars(True)
    bars.trials(study, 5)
    assert (bars.bar.n, bars.bar.total) == (5, 5)
    study.add_trial(create_trial(state=TrialState.COMPLETE, value=1.0))
    bars.trial_done(study)
    assert (bars.bar.n, bars.bar.total) == (6, 6)
    bars.close()


def test_each_replay_of_a_trial_shows_on_the_trials_bar():
    # a generative trial lasts minutes: its steps show where it is, beside the best so far
    import optuna
    from optuna.trial import TrialState, create_trial

    from tuner.measurement import Measurement

    study = optuna.create_study(direction="maximize")
    study.add_trial(create_trial(state=TrialState.COMPLETE, value=100.0))
    bars = Bars(True)
    bars.trials(study, 5)
    bars.trial_done(study)

    def step(speed):
        return Measurement(speed=speed, offered_rps=1, duration_s=1, requests=1, errors=0, error_rate=0.0,
                           throughput_rps=1, latency_ms={"p99": 1.0}, send_lag_ms={"p99": 0.1}, valid=True)

    bars.step(step(0.25))
    bars.step(step(1.3))
    assert bars.bar.postfix == "best=100/$, trial=0, step x1.3", bars.bar.postfix
    bars.remeasure(2)  # and on the re-measure bar, whose count moves once a configuration's search ends
    bars.step(step(0.8))
    assert bars.bar.desc == "re-measure" and bars.bar.postfix == "step x0.8", bars.bar.postfix
    bars.close()
    quiet = Bars(False)  # --quiet: no bar, nothing drawn
    quiet.step(step(1.0))
