"""The progress bars `tune` and `finish` draw while they work (a `tuner.tune.Progress`)."""

from __future__ import annotations

import sys

import optuna
from tqdm import tqdm

from tuner import search
from tuner.tune import Progress


class Bars(Progress):
    """tqdm bars on stderr: the trials (with the best so far), then the re-measurement."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.bar = None
        self._best = ""  # the trials bar's best so far, beside which a step shows

    def note(self, text: str) -> None:
        if self.bar is not None:  # on its own line, the open bar drawn again below it
            tqdm.write(f"tuner: {text}", file=sys.stderr)
        else:
            print(f"tuner: {text}", file=sys.stderr, flush=True)

    def trials(self, study: optuna.Study, total: int) -> None:
        done = search.spent_done(study)
        self._new(max(total, done), done, "trials")

    def trial_done(self, study: optuna.Study) -> None:
        if self.bar is None:
            return
        # a study can hold more than this run planned (a mixed-GPU study's incumbent of each GPU type joining
        # it): the total grows to the count, the bar stays full, and never reads 5 of 5 for 6 trials
        done = search.spent_done(study)
        self.bar.total = max(self.bar.total, done)
        self.bar.n = done
        best = search.best_trial(study)
        self._best = f"best={best.value:.3g}/$, trial={best.number}" if best is not None else ""
        self.bar.set_postfix_str(self._best, refresh=False)
        self.bar.refresh()

    def step(self, m) -> None:
        # which replay of the trial (or of the re-measured configuration) runs now: a generative trial's
        # capacity search lasts minutes under one count
        if self.bar is not None and self.bar.desc in ("trials", "re-measure"):
            best = self._best if self.bar.desc == "trials" else ""
            self.bar.set_postfix_str(", ".join(filter(None, (best, f"step x{m.speed:.3g}"))))

    def profile_point(self, done: int, total: int, what: str) -> None:
        if self.enabled and (self.bar is None or self.bar.desc != "profile"):
            self._new(total, 0, "profile", unit="point")
        if self.bar is not None:
            # counted up front at its most, the total only falls (tuner.profiler.most_points), never under
            # the points done; the count never goes back
            self.bar.total = max(total, done, self.bar.n)
            self.bar.update(max(done - self.bar.n, 0))
            self.bar.set_postfix_str(what)

    def remeasure(self, total: int) -> None:
        self._new(total, 0, "re-measure", unit="replay")  # it counts measurements, several per trial

    def remeasured_one(self) -> None:
        if self.bar is not None:
            self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def _new(self, total: int, initial: int, desc: str, *, unit: str = "trial") -> None:
        self.close()
        if self.enabled:
            self.bar = tqdm(total=total, initial=initial, desc=desc, unit=unit, dynamic_ncols=True)
