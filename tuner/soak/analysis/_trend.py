"""The trend test on a soak's per-window series: is a figure drifting with the server's age?

The model, one row per window:

    value = level + slope * t_hours + load_slope * (offered_load - load_ref) + noise

`t_hours` is the window's start in hours since the server loaded the model. The offered load enters
as a covariate (a regression, not load bands): a soak replays recorded traffic, so windows differ in
load, and a figure such as compute time per request falls when the load rises (fuller batches). With
the load in the model, a load that happens to rise over the soak is not mistaken for a figure getting
better (or, falling, for drift), and every window counts, where load bands would leave few windows
per band. `level` is the figure at t = 0 at the reference load (the median load of the windows); the
linear load term is a local approximation over the loads the soak saw, which is all the comparison
needs. Without the covariate the fit is value = level + slope * t.

The fit is Huber's M-estimator (k = 1.345, coefficients and scale estimated jointly by iteratively
reweighted least squares), chosen over Theil-Sen because it takes the covariate: one window spoiled
by a pause or a hiccup gets a small weight instead of pulling the slope. The slope's interval uses
Huber's covariance (his "H1" correction, which is ordinary least squares' when no window is
down-weighted) with Student's t on n - p degrees of freedom; on flat synthetic series (normal or
heavy-tailed noise, 6 to 48 windows) it excludes zero in 4-6 % of runs at 95 %. Windows are taken as independent given the model (allowing for autocorrelated
residuals instead would also hide a real drift that starts midway, which a straight line underfits);
the practical threshold below keeps a slowly wandering series from being called drift.

A drift is a figure getting worse with the server's age: `worse` names the direction that is (`up`
for a compute time, a latency, an error rate or memory; `down` for a capacity). A significant trend
the other way is `improving` (a server still warming up, caches filling), reported but not an alarm.
The verdict is `drift` only when the interval excludes zero, the trend goes the `worse` way (either
way when `worse` is not given) AND the relative drift (slope / level, per hour) is at least
`min_drift_per_hour` (1 % by default); otherwise `no drift detected`, a valid result. A figure whose
level at 0 h is not positive (a count of errors that starts at zero) has no relative drift; its
slope is compared with its mean over the windows.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats

from tuner.soak.analysis._common import OneRow, SoakDataError, json_number

DRIFT = "drift"
NO_DRIFT = "no drift detected"
IMPROVING = "improving"
UP, DOWN = "up", "down"  # the direction in which a figure gets worse
HUBER_K = 1.345          # 95 % efficiency under normal noise
_MAD_TO_SIGMA = 0.6744897501960817  # the normal distribution's 3/4 quantile
_MIN_DOF = 3             # windows beyond the parameters fitted, so that an interval means something


@dataclass(frozen=True, kw_only=True)
class Trend(OneRow):
    """A figure's fitted drift per hour since the server's load, its interval and the verdict."""

    figure: str
    windows: int                  # windows with a value (and a load, when used)
    span_hours: tuple[float, float]
    level: float                  # fitted figure at t = 0 h, at the reference load
    slope_per_hour: float
    slope_low: float
    slope_high: float
    confidence: float
    p_value: float                # two-sided, slope = 0
    relative_per_hour: float      # slope / level (NaN when the level is not positive)
    relative_low: float
    relative_high: float
    min_drift_per_hour: float
    verdict: str                  # DRIFT, IMPROVING or NO_DRIFT
    load: str | None = None       # the covariate's column, when used
    load_ref: float | None = None  # the load at which `level` is given
    load_slope: float | None = None  # the figure's change per unit of load
    downweighted: int = 0         # windows the robust fit gave less than full weight
    worse: str | None = None      # UP or DOWN: the direction that is a drift (None: either)
    notes: tuple[str, ...] = ()

    @property
    def drifting(self) -> bool:
        """True when the verdict is drift."""
        return self.verdict == DRIFT

    @property
    def direction(self) -> str:
        """`up` or `down` for a drift, empty otherwise."""
        if not self.drifting:
            return ""
        return "up" if self.slope_per_hour > 0 else "down"

    def level_at(self, t_hours: float | np.ndarray, load: float | None = None) -> float | np.ndarray:
        """The fitted figure at `t_hours` since the load (at `load`, default the reference load)."""
        value = self.level + self.slope_per_hour * np.asarray(t_hours, dtype=np.float64)
        if load is not None and self.load_slope is not None and self.load_ref is not None:
            value = value + self.load_slope * (float(load) - self.load_ref)
        return float(value) if np.ndim(value) == 0 else value

    def row(self) -> dict:
        """One row of the trend table, as a person reads it."""
        pct = 100.0
        return {
            "figure": self.figure,
            "windows": self.windows,
            "level at 0 h": self.level,
            "slope per h": self.slope_per_hour,
            f"{self.confidence:.0%} CI low": self.slope_low,
            f"{self.confidence:.0%} CI high": self.slope_high,
            "drift % per h": pct * self.relative_per_hour,
            "p": self.p_value,
            "verdict": self.verdict,
        }

    def as_dict(self) -> dict:
        """The trend as JSON-ready values (NaN and infinities become null)."""
        return {
            "figure": self.figure,
            "windows": self.windows,
            "span_hours": [json_number(x) for x in self.span_hours],
            "level": json_number(self.level),
            "slope_per_hour": json_number(self.slope_per_hour),
            "slope_interval": [json_number(self.slope_low), json_number(self.slope_high)],
            "confidence": self.confidence,
            "p_value": json_number(self.p_value),
            "relative_per_hour": json_number(self.relative_per_hour),
            "relative_interval": [json_number(self.relative_low), json_number(self.relative_high)],
            "min_drift_per_hour": self.min_drift_per_hour,
            "verdict": self.verdict,
            "direction": self.direction,
            "load": self.load,
            "load_ref": json_number(self.load_ref),
            "load_slope": json_number(self.load_slope),
            "downweighted": self.downweighted,
            "worse": self.worse,
            "method": f"huber (k={HUBER_K})",
            "notes": list(self.notes),
        }


def fit_trend(
    windows: pd.DataFrame,
    figure: str,
    *,
    time: str = "t_hours",
    load: str | None = None,
    confidence: float = 0.95,
    min_drift_per_hour: float = 0.01,
    worse: str | None = None,
) -> Trend:
    """The trend of column `figure` over column `time` (hours since load), with column `load` as a
    covariate when given, and its verdict (`worse`: UP or DOWN, the direction that is a drift).
    Windows missing the figure (or the load) are left out."""
    _check_parameters(confidence, min_drift_per_hour)
    if worse not in (None, UP, DOWN):
        raise SoakDataError(f"trend of {figure!r}: worse must be {UP!r}, {DOWN!r} or None, got {worse!r}")
    _require_columns(windows, [time, figure] + ([load] if load else []))
    used = [time, figure] + ([load] if load else [])
    data = windows[used].apply(pd.to_numeric, errors="coerce")
    data = data[np.isfinite(data.to_numpy(dtype=np.float64)).all(axis=1)]
    t = data[time].to_numpy(dtype=np.float64)
    y = data[figure].to_numpy(dtype=np.float64)
    notes: list[str] = []
    if len(data) < len(windows):
        notes.append(f"{len(windows) - len(data)} window(s) without a finite {figure}"
                     + (f" or {load}" if load else "") + " left out")

    columns = [np.ones_like(t), t]
    load_ref = None
    if load:
        x = data[load].to_numpy(dtype=np.float64)
        load_ref = float(np.median(x)) if len(x) else 0.0
        if len(x) and np.ptp(x) <= 1e-9 * max(abs(load_ref), 1.0):
            notes.append(f"{load} is the same in every window: fitted without it")
            load, load_ref = None, None
        else:
            columns.append(x - load_ref)
    X = np.column_stack(columns)
    n, p = X.shape
    if n < p + _MIN_DOF:
        raise SoakDataError(
            f"trend of {figure!r}: needs at least {p + _MIN_DOF} windows with a value, got {n}"
        )
    if np.ptp(t) <= 0:
        raise SoakDataError(f"trend of {figure!r}: every window has the same {time} ({t[0]:g}): no time to trend over")
    if np.linalg.matrix_rank(X) < p:
        raise SoakDataError(
            f"trend of {figure!r}: {load} changes in step with {time}, so drift and load cannot be told "
            "apart; fit without the load or soak over traffic whose load varies"
        )

    beta, cov, weights = huber_fit(X, y)
    dof = n - p
    slope = float(beta[1])
    se = math.sqrt(max(float(cov[1, 1]), 0.0))
    q = float(stats.t.ppf(0.5 + confidence / 2, dof))
    low, high = slope - q * se, slope + q * se
    if se > 0:
        p_value = float(2 * stats.t.sf(abs(slope) / se, dof))
    else:
        p_value = 0.0 if slope != 0 else 1.0
    level = float(beta[0])
    if level > 0:
        rel, rel_low, rel_high = slope / level, low / level, high / level
        practical = abs(rel) >= min_drift_per_hour
    else:
        # a count that starts at zero (errors, failed batches): no relative drift; the threshold is
        # read against the figure's mean size instead, so that a single spike is not a drift
        rel = rel_low = rel_high = float("nan")
        typical = float(np.mean(np.abs(y)))
        practical = typical > 0 and abs(slope) / typical >= min_drift_per_hour
        notes.append(f"the level at 0 h is not positive: no relative drift; the threshold is taken against "
                     f"the mean of {figure} ({typical:.4g})")
    excludes_zero = low > 0 or high < 0
    if excludes_zero and practical and worse is not None and (slope > 0) != (worse == UP):
        verdict = IMPROVING
    else:
        verdict = DRIFT if excludes_zero and practical else NO_DRIFT
    return Trend(
        figure=figure, windows=n, span_hours=(float(t.min()), float(t.max())), level=level,
        slope_per_hour=slope, slope_low=low, slope_high=high, confidence=confidence, p_value=p_value,
        relative_per_hour=rel, relative_low=rel_low, relative_high=rel_high,
        min_drift_per_hour=min_drift_per_hour, verdict=verdict, worse=worse,
        load=load, load_ref=load_ref, load_slope=float(beta[2]) if load else None,
        downweighted=int(np.count_nonzero(weights < 1.0)), notes=tuple(notes),
    )


def huber_fit(X: np.ndarray, y: np.ndarray, *, k: float = HUBER_K, max_iter: int = 200
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Huber regression of `y` on the columns of `X`: coefficients, their covariance, final weights.

    Coefficients and scale are estimated jointly (Huber's "proposal 2" scale, started from the median
    absolute deviation): with few windows it gives the interval its nominal coverage, where the
    median absolute deviation alone is too noisy a scale and the interval too narrow."""
    n, p = X.shape
    beta = np.linalg.lstsq(X, y, rcond=None)[0]
    resid = y - X @ beta
    scale = _mad(resid) or math.sqrt(float(resid @ resid) / (n - p))
    if scale <= 0:  # an exact fit: nothing to weigh, no spread
        return beta, np.zeros((p, p)), np.ones(n)
    gauss = stats.norm
    # E[psi(Z)^2] for a standard normal Z: makes the scale consistent for normal noise
    b = (2 * gauss.cdf(k) - 1) - 2 * k * gauss.pdf(k) + 2 * k**2 * gauss.sf(k)
    for _ in range(max_iter):
        u = np.abs(resid) / scale
        weights = np.where(u <= k, 1.0, k / np.maximum(u, 1e-300))
        root = np.sqrt(weights)
        new = np.linalg.lstsq(X * root[:, None], y * root, rcond=None)[0]
        resid = y - X @ new
        new_scale = math.sqrt(float(np.minimum(resid**2, (k * scale) ** 2).sum()) / ((n - p) * b))
        done = (np.allclose(new, beta, rtol=1e-10, atol=1e-12 * scale)
                and abs(new_scale - scale) <= 1e-10 * scale)
        beta = new
        if new_scale <= 0:
            return beta, np.zeros((p, p)), np.ones(n)
        scale = new_scale
        if done:
            break
    u = resid / scale
    weights = np.where(np.abs(u) <= k, 1.0, k / np.maximum(np.abs(u), 1e-300))
    psi = np.clip(u, -k, k)
    dpsi = (np.abs(u) <= k).astype(np.float64)
    m = float(dpsi.mean())
    if m == 0:  # cannot happen with a consistent scale; keep the least-squares covariance then
        return beta, float(resid @ resid) / (n - p) * np.linalg.pinv(X.T @ X), weights
    correction = 1.0 + (p / n) * float(dpsi.var()) / m**2
    factor = correction**2 * float(psi @ psi) / (n - p) / m**2
    return beta, factor * scale**2 * np.linalg.pinv(X.T @ X), weights


def _mad(resid: np.ndarray) -> float:
    """The normal-consistent median absolute deviation of the residuals."""
    return float(np.median(np.abs(resid - np.median(resid)))) / _MAD_TO_SIGMA


def _check_parameters(confidence: float, min_drift_per_hour: float) -> None:
    if not (0 < confidence < 1):
        raise SoakDataError(f"confidence must be between 0 and 1 (e.g. 0.95), got {confidence}")
    if not (min_drift_per_hour >= 0 and math.isfinite(min_drift_per_hour)):
        raise SoakDataError(f"min_drift_per_hour must be a fraction >= 0 (e.g. 0.01), got {min_drift_per_hour}")


def _require_columns(windows: pd.DataFrame, columns: Sequence[str]) -> None:
    missing = [c for c in columns if c not in windows.columns]
    if missing:
        found = ", ".join(map(str, windows.columns)) or "none"
        raise SoakDataError(f"soak windows: no column {missing[0]!r} (columns found: {found})")
