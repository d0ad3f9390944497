"""Synthetic traffic: arrival processes and request sizes, seeded and reproducible.

Arrivals: Poisson at a rate; diurnal (a day's sinusoidal rate, the day compressible to any period);
bursty (an on/off Markov-modulated Poisson process); flash crowd (a base rate, a ramp to a peak, a
hold, an exponential decay). Non-constant rates are drawn by thinning a Poisson process at the peak
rate, all in numpy. Sizes per column: `constant:N`, `zipf:a=A,max=M` (truncated Zipf on 1..M) or
`lognormal:median=M,sigma=S,max=X[,min=Y]` (rounded, clipped to [min, max]).

Timestamps start at 0 and are rounded to the microsecond; the same arguments and seed give the same
table, bit for bit.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd

from tuner.errors import TrafficError
from tuner.traffic.io import BATCH_SIZE, RESERVED, TIMESTAMP

SIZE_KINDS = ("constant", "zipf", "lognormal")
# The most rows one table may have: about 40 bytes a row at the peak of making it (4 GB here), so a
# request for more is refused from rate x duration before anything is allocated
MAX_ROWS = 100_000_000
ZIPF_MAX = 10_000_000  # a zipf size draws from a table of `max` weights
SIZE_MAX = 1_000_000_000  # the largest size any spec gives (rows or tokens of one request)
SEED_MAX = 2**32 - 1  # the seeds a study's search.seed takes too


@dataclass(frozen=True, kw_only=True)
class SizeSpec:
    """How one size column (batch_size or a shape column) is drawn."""

    kind: str = "constant"
    value: int = 1  # constant
    a: float = 1.5  # zipf exponent
    median: float = 200.0  # lognormal
    sigma: float = 0.6
    min: int = 1
    max: int = 512

    @classmethod
    def parse(cls, text: str) -> SizeSpec:
        """`constant:4`, `zipf:a=1.2,max=32`, `lognormal:median=200,sigma=0.6,max=512`."""
        kind, _, rest = text.partition(":")
        kind = kind.strip().lower()
        if kind not in SIZE_KINDS:
            raise TrafficError(
                f"size {text!r}: unknown kind {kind!r} (expected one of {', '.join(SIZE_KINDS)})"
            )
        fields: dict[str, float] = {}
        if kind == "constant":
            if rest.strip():
                fields["value"] = _number(text, "value", rest)
        else:
            for item in filter(None, (p.strip() for p in rest.split(","))):
                key, eq, val = item.partition("=")
                allowed = {"zipf": ("a", "max"), "lognormal": ("median", "sigma", "min", "max")}[kind]
                if not eq or key.strip() not in allowed:
                    raise TrafficError(
                        f"size {text!r}: expected key=value with keys {', '.join(allowed)}, got {item!r}"
                    )
                if key.strip() in fields:  # the last would win without a word
                    raise TrafficError(f"size {text!r}: {key.strip()} is given twice")
                fields[key.strip()] = _number(text, key.strip(), val)
        for key in ("value", "min", "max"):  # counts of rows or tokens: whole, not silently cut
            if key in fields:
                if not math.isfinite(fields[key]) or fields[key] != int(fields[key]):
                    raise TrafficError(f"size {text!r}: {key} must be a whole number, got {fields[key]:g}")
                fields[key] = int(fields[key])
        spec = cls(kind=kind, **fields)  # type: ignore[arg-type]
        spec.check(text)
        return spec

    def check(self, label: str) -> None:
        """Check the spec's parameters are usable; TrafficError naming `label` if not."""
        if self.kind == "constant" and self.value < 1:
            raise TrafficError(f"size {label!r}: a constant size must be >= 1, got {self.value}")
        if self.kind == "zipf" and (self.a <= 0 or self.max < 1):
            raise TrafficError(
                f"size {label!r}: zipf needs a > 0 and max >= 1, got a={self.a}, max={self.max}"
            )
        if self.kind == "zipf" and self.max > ZIPF_MAX:
            raise TrafficError(f"size {label!r}: zipf max must be <= {ZIPF_MAX:,}, got max={self.max}")
        for key in ("value", "min", "max"):  # a size column is int64 (numpy's draw); no request is near this
            if getattr(self, key) > SIZE_MAX:
                raise TrafficError(f"size {label!r}: {key} must be <= {SIZE_MAX:,}, got {getattr(self, key):,}")
        if self.kind == "lognormal" and not (
            self.median > 0 and self.sigma >= 0 and 1 <= self.min <= self.max
        ):
            raise TrafficError(
                f"size {label!r}: lognormal needs median > 0, sigma >= 0 and 1 <= min <= max, got "
                f"median={self.median}, sigma={self.sigma}, min={self.min}, max={self.max}"
            )
        if self.kind == "lognormal" and not self.min <= self.median <= self.max:  # every draw would be clamped
            raise TrafficError(f"size {label!r}: lognormal median {self.median:g} lies outside [min, max] = "
                               f"[{self.min}, {self.max}] (max defaults to 512): raise max or lower the median")

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """`n` sizes drawn from the spec with `rng`, as int64."""
        if self.kind == "constant":
            return np.full(n, self.value, dtype=np.int64)
        if self.kind == "zipf":
            support = np.arange(1, self.max + 1)
            weights = support.astype(np.float64) ** -self.a
            return rng.choice(support, size=n, p=weights / weights.sum()).astype(np.int64)
        values = np.rint(rng.lognormal(np.log(self.median), self.sigma, size=n))
        return np.clip(values, self.min, self.max).astype(np.int64)


def _number(text: str, key: str, value: str) -> float:
    try:
        return float(value)
    except ValueError:
        raise TrafficError(f"size {text!r}: {key} must be a number, got {value.strip()!r}") from None


Sizes = Mapping[str, "SizeSpec | str"] | None


def _table(times: np.ndarray, rng: np.random.Generator, sizes: Sizes) -> pd.DataFrame:
    times = np.round(np.sort(times), 6)
    out: dict[str, np.ndarray] = {TIMESTAMP: times}
    specs = dict(sizes or {})
    specs.setdefault(BATCH_SIZE, SizeSpec())
    # batch_size first, then the shape columns in the order given: the draw order fixes the result
    for col in [BATCH_SIZE] + [c for c in specs if c != BATCH_SIZE]:
        spec = specs[col]
        spec = SizeSpec.parse(spec) if isinstance(spec, str) else spec
        spec.check(col)
        out[col] = spec.draw(rng, len(times))
    return pd.DataFrame(out)


def _check(rate: float, duration_s: float) -> None:
    if not (np.isfinite(rate) and rate > 0):
        raise TrafficError(f"rate must be a positive number of requests/s, got {rate}")
    if not (np.isfinite(duration_s) and duration_s > 0):
        raise TrafficError(f"duration must be a positive number of seconds, got {duration_s}")


def _about(n: float) -> str:
    """A count to three significant figures, written out: 6.048e17 -> 605,000,000,000,000,000."""
    return f"{float(f'{n:.3g}'):,.0f}"


def _fits(what: str, rate: float, duration_s: float, *, at_peak: bool = False) -> None:
    """Refuse a table of more than MAX_ROWS rows, from its rate and duration, before drawing it."""
    rows = rate * duration_s
    if rows > MAX_ROWS:
        raise TrafficError(
            f"{what}: {rate:g} requests/s{' at the peak' if at_peak else ''} for {duration_s:g} s would make "
            f"about {_about(rows)} rows, above the limit of {MAX_ROWS:,} rows (tuner.traffic.synth.MAX_ROWS, "
            "about 4 GB of memory to make); lower the rate or the duration"
        )


def _poisson_times(rng: np.random.Generator, rate: float, start: float, *, length: float) -> np.ndarray:
    n = rng.poisson(rate * length)
    return start + rng.uniform(0.0, length, size=n)


def _thinned(rng: np.random.Generator, rate_at, peak: float, *, duration_s: float) -> np.ndarray:
    candidates = np.sort(_poisson_times(rng, peak, 0.0, length=duration_s))
    keep = rng.uniform(0.0, peak, size=len(candidates)) < rate_at(candidates)
    return candidates[keep]


def _nonempty(times: np.ndarray, what: str) -> np.ndarray:
    if len(times) == 0:
        raise TrafficError(f"{what}: drew no requests; raise the rate or the duration")
    return times


def _needs(ok: bool, rule: str, **got: float) -> None:
    """Refuse shape parameters that break `rule`, naming each one's value."""
    if not ok:
        raise TrafficError(f"{rule}, got " + ", ".join(f"{name}={value}" for name, value in got.items()))


def check_seed(seed: int, what: str = "seed") -> int:
    """The seed, once it is an integer in 0..SEED_MAX (numpy refuses a negative one with a traceback);
    TrafficError naming `what` otherwise."""
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or not 0 <= seed <= SEED_MAX:
        raise TrafficError(f"{what}: must be in 0..{SEED_MAX}, got {seed!r}")
    return int(seed)


def _draw(what: str, arrivals: Callable[[np.random.Generator], np.ndarray], *, seed: int,
          sizes: Sizes) -> pd.DataFrame:
    """The table of `arrivals(rng)` and its sizes, from one generator seeded with `seed`."""
    check_seed(seed)
    for col in sizes or {}:
        if col in RESERVED and col != BATCH_SIZE:  # its values would replace the arrivals or name models
            raise TrafficError(f"size {col!r}: not a size column (sizes are drawn for {BATCH_SIZE}, shape columns "
                               "such as seq_len, and token counts)")
    rng = np.random.default_rng(seed)  # arrivals draw first, then sizes: the order fixes the result
    return _table(_nonempty(arrivals(rng), what), rng, sizes)


def synth_poisson(rate: float, duration_s: float, *, seed: int = 0, sizes: Sizes = None) -> pd.DataFrame:
    """Poisson arrivals at `rate` requests/s for `duration_s` seconds (inter-arrival CV 1)."""
    _check(rate, duration_s)
    _fits("poisson", rate, duration_s)
    return _draw("poisson", lambda rng: _poisson_times(rng, rate, 0.0, length=duration_s), seed=seed, sizes=sizes)


def synth_diurnal(mean_rate: float, duration_s: float, *, seed: int = 0, sizes: Sizes = None,
                  period_s: float = 86400.0, amplitude: float = 0.6, peak_at_s: float | None = None
                  ) -> pd.DataFrame:
    """A day's sinusoidal rate: `mean_rate * (1 + amplitude * cos(2 pi (t - peak_at_s) / period_s))`.

    `period_s` compresses the day (600 plays a day in ten minutes); the peak defaults to 14:00.
    """
    _check(mean_rate, duration_s)
    if not 0 <= amplitude <= 1:
        raise TrafficError(f"diurnal amplitude must be in [0, 1], got {amplitude}")
    if not period_s > 0:
        raise TrafficError(f"diurnal period must be > 0 s, got {period_s}")
    peak = mean_rate * (1 + amplitude)
    _fits("diurnal", peak, duration_s, at_peak=True)
    peak_at = period_s * 14 / 24 if peak_at_s is None else float(peak_at_s)

    def rate_at(t: np.ndarray) -> np.ndarray:
        return mean_rate * (1 + amplitude * np.cos(2 * np.pi * (t - peak_at) / period_s))

    return _draw("diurnal", lambda rng: _thinned(rng, rate_at, peak, duration_s=duration_s), seed=seed, sizes=sizes)


def bursty_rates(mean_rate: float, on_fraction: float, off_ratio: float) -> tuple[float, float]:
    """The on and off rates of the on/off process that averages `mean_rate`."""
    rate_off = off_ratio * mean_rate
    rate_on = (mean_rate - (1 - on_fraction) * rate_off) / on_fraction
    return rate_on, rate_off


def synth_bursty(mean_rate: float, duration_s: float, *, seed: int = 0, sizes: Sizes = None,
                 on_fraction: float = 0.2, mean_on_s: float = 0.5, off_ratio: float = 0.05) -> pd.DataFrame:
    """On/off Markov-modulated Poisson arrivals averaging `mean_rate`.

    The process spends `on_fraction` of the time in bursts lasting `mean_on_s` on average
    (exponential sojourns in both states); the quiet rate is `off_ratio * mean_rate` and the burst
    rate makes up the mean. The defaults give an inter-arrival CV well above 2.
    """
    _check(mean_rate, duration_s)
    _needs(0 < on_fraction < 1 and mean_on_s > 0 and 0 <= off_ratio < 1,
           "bursty needs 0 < on_fraction < 1, mean_on_s > 0 and 0 <= off_ratio < 1",
           on_fraction=on_fraction, mean_on_s=mean_on_s, off_ratio=off_ratio)
    _fits("bursty", mean_rate, duration_s)
    rates = bursty_rates(mean_rate, on_fraction, off_ratio)
    sojourns = (mean_on_s, mean_on_s * (1 - on_fraction) / on_fraction)  # mean on, mean off
    _fits_periods(duration_s, sojourns)

    def arrivals(rng: np.random.Generator) -> np.ndarray:
        start_on = rng.uniform() < on_fraction  # weighted by the time spent in each state
        return _on_off_times(rng, duration_s, start_on=start_on, sojourns=sojourns, rates=rates)

    return _draw("bursty", arrivals, seed=seed, sizes=sizes)


def _fits_periods(duration_s: float, sojourns: tuple[float, float]) -> None:
    """Refuse more than MAX_ROWS on/off periods (tiny bursts over a long time) before drawing them."""
    periods = 2 * duration_s / sum(sojourns)
    if periods > MAX_ROWS:
        raise TrafficError(
            f"bursty: bursts of {sojourns[0]:g} s on average for {duration_s:g} s would make about "
            f"{_about(periods)} on/off periods, above the limit of {MAX_ROWS:,}; lengthen the bursts "
            "or shorten the duration"
        )


def _on_off_times(rng: np.random.Generator, duration_s: float, *, start_on: bool,
                  sojourns: tuple[float, float], rates: tuple[float, float]) -> np.ndarray:
    """Arrivals of alternating exponential on/off sojourns, Poisson at each state's rate within it."""
    (mean_on_s, mean_off_s), (rate_on, rate_off) = sojourns, rates
    cycles = int(duration_s / (mean_on_s + mean_off_s) * 1.5) + 16
    while True:
        on = rng.exponential(mean_on_s, size=cycles)
        off = rng.exponential(mean_off_s, size=cycles)
        pairs = np.column_stack([on, off] if start_on else [off, on]).ravel()
        if pairs.sum() >= duration_s:
            break
        cycles *= 2
    ends = np.cumsum(pairs)
    n_seg = int(np.searchsorted(ends, duration_s, side="left")) + 1
    starts = np.concatenate([[0.0], ends[: n_seg - 1]])
    lengths = np.minimum(ends[:n_seg], duration_s) - starts
    is_on = (np.arange(n_seg) % 2 == 0) == start_on
    counts = rng.poisson(np.where(is_on, rate_on, rate_off) * lengths)
    return np.repeat(starts, counts) + rng.uniform(0.0, 1.0, size=counts.sum()) * np.repeat(lengths, counts)


def synth_flash_crowd(base_rate: float, duration_s: float, *, seed: int = 0, sizes: Sizes = None,
                      peak_factor: float = 10.0, spike_at_s: float | None = None, ramp_s: float = 5.0,
                      hold_s: float = 10.0, decay_s: float = 10.0) -> pd.DataFrame:
    """A steady `base_rate` that ramps linearly to `peak_factor` times itself at `spike_at_s`,
    holds for `hold_s`, then decays back exponentially with time constant `decay_s`."""
    _check(base_rate, duration_s)
    _needs(peak_factor >= 1 and ramp_s >= 0 and hold_s >= 0 and decay_s > 0,
           "flash crowd needs peak_factor >= 1, ramp_s >= 0, hold_s >= 0 and decay_s > 0",
           peak_factor=peak_factor, ramp_s=ramp_s, hold_s=hold_s, decay_s=decay_s)
    peak = base_rate * peak_factor
    _fits("flash crowd", peak, duration_s, at_peak=True)
    spike = duration_s / 3 if spike_at_s is None else float(spike_at_s)
    _needs(0 <= spike < duration_s, "flash crowd needs its spike within the traffic, 0 <= spike_at_s < duration_s",
           spike_at_s=spike, duration_s=duration_s)

    def rate_at(t: np.ndarray) -> np.ndarray:
        rising = np.clip((t - spike) / ramp_s, 0.0, 1.0) if ramp_s > 0 else (t >= spike).astype(float)
        after = np.maximum(t - spike - ramp_s - hold_s, 0.0)
        level = np.where(t < spike + ramp_s + hold_s, rising, np.exp(-after / decay_s))
        return base_rate * (1 + (peak_factor - 1) * level)

    return _draw("flash crowd", lambda rng: _thinned(rng, rate_at, peak, duration_s=duration_s), seed=seed, sizes=sizes)
