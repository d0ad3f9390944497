"""Triton's counters scraped straight from its metrics port (`tuner exporter --triton`), held in memory:
the parse of one /metrics text, and the samples of the last window per server with counter resets
handled, read out as the Counters the audit judges (tuner/production/_audit.py's `judge`). Pure: no HTTP.

A counter that goes down between two samples means the server restarted: its counters started again at
zero, so the increase since the restart is the new value (what Prometheus's increase() does too).
Versions of the model are summed; servers are kept apart (one `instance` each, as Prometheus labels them).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping

import numpy as np
import pandas as pd
from prometheus_client.parser import text_string_to_metric_families

from tuner.production._figures import COLUMNS, SECONDS
from tuner.production._series import METRICS, Counters

__all__ = ["CounterWindow", "Scrape", "parse_scrape"]

_COLUMN_OF = {metric: column for column, metric in METRICS.items()}
Values = tuple[float, ...]  # one series' counters, in COLUMNS' order


class Scrape:
    """One /metrics text of a Triton: the study's model's counters by version, and every model seen."""

    def __init__(self, series: dict[str, Values], models: set[str]):
        self.series, self.models = series, models


def parse_scrape(text: str, model: str) -> Scrape | None:
    """The counters of `model` in a /metrics text (Prometheus's text format), summed by version (a
    labelled counter, as nv_inference_request_failure{reason}, is one series per version); None when
    the text is not Prometheus's format or has no Triton inference counters."""
    sums: dict[str, list[float]] = {}
    models: set[str] = set()
    found = False
    try:
        for family in text_string_to_metric_families(text):
            column = _COLUMN_OF.get(family.name)
            if column is None:
                continue
            found = True
            k = COLUMNS.index(column)
            for sample in family.samples:
                if sample.name.endswith("_created"):  # when the counter began: not a count
                    continue
                models.add(sample.labels.get("model", ""))
                if sample.labels.get("model") == model:
                    sums.setdefault(sample.labels.get("version", ""), [0.0] * len(COLUMNS))[k] += sample.value
    except ValueError:  # a page, another format
        return None
    if not found:
        return None
    return Scrape({v: tuple(s) for v, s in sums.items()}, models)


class CounterWindow:
    """The samples of the last `window_s` seconds of each server: per server, the running total of its
    counters (all versions, across restarts) at each scrape, and the times of its restarts."""

    def __init__(self, window_s: float):
        self.window_s = window_s
        self._totals: dict[str, deque[tuple[float, np.ndarray]]] = {}
        self._last: dict[str, dict[str, Values]] = {}  # the server's last series, to take increases from
        self._resets: dict[str, deque[float]] = {}

    def add(self, instance: str, at: float, series: Mapping[str, Values]) -> None:
        """A scrape of `instance` at `at` (Unix seconds, increasing): its series by version."""
        samples = self._totals.setdefault(instance, deque())
        resets = self._resets.setdefault(instance, deque())
        last = self._last.get(instance)
        total = samples[-1][1].copy() if samples else np.zeros(len(COLUMNS))
        if last is not None:
            restarted = False
            for version, values in series.items():
                before = last.get(version)
                now = np.asarray(values, dtype=float)
                if before is None:  # a version loaded since (or back after a restart): from zero
                    total += now
                elif (now < np.asarray(before)).any():  # went down: the server restarted
                    restarted = True
                    total += now
                else:
                    total += now - np.asarray(before)
            if restarted:
                resets.append(at)
        self._last[instance] = dict(series)
        samples.append((at, total))
        self._trim(at)

    def _trim(self, now: float) -> None:
        """Forget what is older than the window (every server: one that stopped answering ages out too)."""
        for instance, samples in self._totals.items():
            while samples and samples[0][0] < now - self.window_s:
                samples.popleft()
            resets = self._resets[instance]
            while resets and resets[0] < now - self.window_s:
                resets.popleft()

    def counters(self, *, now: float) -> tuple[Counters, float]:
        """The window's increases as one step (`judge`'s input) and that step's length in seconds.

        The step ends at the newest sample and is as long as the longest span a server's samples cover;
        a server whose samples cover less (it joined, or stopped answering) served that span only (its
        SECONDS). Servers with fewer than two samples have no row; no row at all: an empty frame over
        the whole window (`judge` says nothing to measure, as for a Prometheus window without two
        samples)."""
        held = {i: s for i, s in self._totals.items() if len(s) >= 2 and s[-1][0] > s[0][0]}
        if not held:
            end, step_s, rows = now, self.window_s, {}
        else:
            end = max(s[-1][0] for s in held.values())
            step_s = max(s[-1][0] - s[0][0] for s in held.values())
            rows = {i: np.append(s[-1][1] - s[0][1], s[-1][0] - s[0][0]) for i, s in held.items()}
        at = _time(end)
        index = pd.MultiIndex.from_arrays(
            [pd.DatetimeIndex([at] * len(rows)), list(rows)], names=["end", "instance"]
        )
        increases = pd.DataFrame(list(rows.values()) or None, index=index, columns=[*COLUMNS, SECONDS], dtype=float)
        resets = {i: len(self._resets.get(i, ())) for i in self._totals}
        return Counters(increases, pd.DatetimeIndex([at], name="end"), resets), step_s


def _time(seconds: float) -> pd.Timestamp:
    """Unix seconds as a UTC time to the millisecond (as the Prometheus source's steps are)."""
    return pd.Timestamp(round(seconds * 1000), unit="ms", tz="UTC")
