"""A model's execution-time profile: what the dynamic-batcher simulation charges each execution (pure).

A profile is measured once through Triton and then answers "how long does one execution of `rows`
rows take when its longest request has `length` tokens?" for any (rows, length), plus the costs
around it. Its parts, as the simulation (`tuner.simulate`) uses them:

- `points`: the **device time** of one execution at measured (rows, length): median, p10, p90 and
  the count of repeats. Executions hold the device exclusively, `concurrent_executions` at a time
  (1: instances share one device and their executions serialise, as the emulated GPU's fcntl lock
  does in `model_repository_templates/encoder_sim`).
- `device_overlap`: the share (0 to < 1) of an execution's device time that another instance's
  execution can run beside, when the executions otherwise take turns (`concurrent_executions` 1):
  what Triton counts as compute but the device does not hold (the Python backend's work inside the
  model's execute, a model's own pre/post-processing) and kernels that share the device. The device is
  held for the rest; the instance for the whole. Measured by `tuner profile` with its instances at
  once; 0 (the whole device time exclusive) in profiles that do not say.
- `host_ms_per_row`, `host_ms_per_execution`: host work per row (pre/post-processing) and per
  execution (e.g. the Python backend's exchange with its stub) that occupies the model instance but
  not the device: half before the device part, half after it (so a second instance can use the
  device meanwhile).
- `host_ms_per_request`: host work for each request of an execution after the first (the Python
  backend fetches each request's tensors and builds its response; Triton gathers and scatters them):
  a batch of N one-row requests costs this x (N - 1) more than one request of N rows. Split like the
  other host work, half before and half after the device part. 0 in profiles that do not say.
- `overhead_ms`: per-request latency outside the model instances (HTTP, queue and input/output
  handling in Triton): added to every request's latency, occupying nothing.
- `oom_rows`: the memory limit per measured length, (length, smallest rows that ran out of memory)
  pairs; the largest rows that ran at a length are its points'. `fails(rows, length)` decides from
  the nearest measured lengths: at a measured length, rows at or above its failing rows fail; between
  two, the smaller of their failing rows (memory grows with length: the longer one's limit holds for
  sure, the shorter one's is all that is known); below the shortest, its limit; beyond the longest,
  its limit in padded tokens as well (rows x length at or above failing rows x that length). A failing
  execution fails every request in it and holds the device `oom_ms`.
- `oom_tokens`: a limit in padded tokens (rows x longest length) at any length, if any (older
  profiles, synthetic ones): an execution at or above it fails as well.
- `max_length`: the model truncates longer inputs to this many tokens (a tokenizer's maximum), so
  cost and padding use min(length, max_length); None: no truncation.

**Interpolation.** Two bases, chosen by `basis` (`auto` picks from the data):
- `tokens`: time is a function of padded tokens (rows x length) alone, piecewise linear through the
  points (the median where several points share a token count). This is what a transformer encoder
  on a GPU does to first order (the emulated GPU is exactly this), and it lets 1 row x 512 tokens
  and 4 rows x 128 tokens inform each other.
- `grid`: bilinear on (rows, length): piecewise linear along rows at each measured length, then
  linear between the two nearest lengths. It makes no assumption but needs points at each length.
`auto` chooses by leave-one-out cross-validation: each point is predicted from the others under
both bases, and the basis with the smaller median relative error wins (ties: tokens, the simpler).
Beyond the last point a curve is extrapolated along its last segment (never downwards: a larger
execution never costs less than the largest measured one); below the first it is flat (fixed costs
dominate small executions).

**File format**: one CSV, a few `# key: value` header lines, then one row per point:

    # tuner profile v1
    # host_ms_per_row: 0.12
    # host_ms_per_execution: 0
    # host_ms_per_request: 0.05
    # overhead_ms: 0.3
    # oom_rows: 256:65, 512:33
    # oom_ms: 3
    # max_length: 512
    # concurrent_executions: 1
    # device_overlap: 0.2
    # basis: auto
    rows,length,median_ms,p10_ms,p90_ms,count
    1,128,3.48,3.40,3.61,20

`pandas.read_csv(path, comment="#")` reads the points; `read_profile` reads and checks both.
"""

from __future__ import annotations

import bisect
import io
import math
import os
import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, fields
from pathlib import Path

import pandas as pd

from tuner.errors import ProfileError
from tuner.files import read_text, write_atomic
from tuner.formats import first_line

BASES = ("auto", "tokens", "grid")
FORMAT_LINE = "# tuner profile v1"
COLUMNS = ("rows", "length", "median_ms", "p10_ms", "p90_ms", "count")
REQUIRED_COLUMNS = ("rows", "length", "median_ms")


@dataclass(frozen=True)
class ExecutionSize:
    """The size of one execution: `rows` rows padded to `length` tokens."""

    rows: int
    length: int

    @property
    def tokens(self) -> int:
        """The execution's padded tokens: rows x length."""
        return self.rows * self.length


@dataclass(frozen=True)
class ProfilePoint(ExecutionSize):
    """One measured execution size: device time of `rows` rows padded to `length` tokens."""

    median_ms: float
    p10_ms: float
    p90_ms: float
    count: int = 1


@dataclass(frozen=True, kw_only=True)
class Profile:
    """Execution time by (rows, padded length) and the costs around it; see the module docstring."""

    points: tuple[ProfilePoint, ...]
    host_ms_per_row: float = 0.0
    host_ms_per_execution: float = 0.0
    host_ms_per_request: float = 0.0
    overhead_ms: float = 0.0
    oom_tokens: int | None = None
    oom_rows: tuple[tuple[int, int], ...] = ()
    oom_ms: float = 0.0
    max_length: int | None = None
    concurrent_executions: int = 1
    device_overlap: float = 0.0
    basis: str = "auto"
    model: str = ""
    model_digest: str = ""  # what the model computed with (tuner.study.model_digest): "" unknown (by hand)
    # derived in __post_init__: the interpolator of the chosen basis and the cross-validation errors
    _device_ms: Callable[[int, int], float] = field(init=False, repr=False, compare=False, hash=False)
    _basis_errors: dict = field(init=False, repr=False, compare=False, hash=False)
    _resolved: str = field(init=False, repr=False, compare=False, hash=False)
    _limits: tuple = field(init=False, repr=False, compare=False, hash=False)
    _fails: dict = field(init=False, repr=False, compare=False, hash=False)  # fails() by (rows, length)

    def __post_init__(self) -> None:
        object.__setattr__(self, "points", tuple(self.points))
        object.__setattr__(self, "oom_rows", tuple(sorted((int(n), int(r)) for n, r in self.oom_rows)))
        # (lengths, failing rows) by measured length, for fails(); a length with no failure is inf
        limits = {p.length: math.inf for p in self.points} | dict(self.oom_rows)
        object.__setattr__(self, "_limits", (sorted(limits), [limits[n] for n in sorted(limits)]))
        object.__setattr__(self, "_fails", {})
        _check(self)
        points = _effective_points(self.points, self.max_length)
        errors = _cross_validate(points) if self.basis == "auto" else {}
        resolved = self.basis
        if self.basis == "auto":
            grid_err = errors.get("grid")
            resolved = "grid" if grid_err is not None and grid_err < errors["tokens"] else "tokens"
        object.__setattr__(self, "_basis_errors", errors)
        object.__setattr__(self, "_resolved", resolved)
        object.__setattr__(self, "_device_ms", _interpolator(points, resolved))

    # --- what the simulation asks ---------------------------------------------------------------

    def length_of(self, length: int) -> int:
        """The length the model computes on: truncated to `max_length` when the model truncates."""
        return length if self.max_length is None else min(length, self.max_length)

    def padded_tokens(self, rows: int, length: int) -> int:
        """Tokens the execution computes: rows x the (truncated) longest length."""
        return rows * self.length_of(length)

    def fails(self, rows: int, length: int) -> bool:
        """True when an execution of this size runs out of memory: at or above the failing rows of the
        nearest measured lengths (`oom_rows`, see the module docstring) or at or above `oom_tokens`."""
        known = self._fails.get((rows, length))
        if known is None:  # the simulation asks once per execution: remember the answer
            known = self._fails[rows, length] = (
                (self.oom_tokens is not None and self.padded_tokens(rows, length) >= self.oom_tokens)
                or (bool(self.oom_rows) and rows >= self.rows_limit(length)))
        return known

    def rows_limit(self, length: int) -> float:
        """The fewest rows that fail at `length` by `oom_rows` (inf: none known to fail), conservative
        between measured lengths; beyond the longest, its padded tokens divided by `length`."""
        lengths, failing = self._limits
        n = self.length_of(length)
        k = bisect.bisect_left(lengths, n)
        if k < len(lengths) and lengths[k] == n:
            return failing[k]
        if k == 0:
            return failing[0]
        if k == len(lengths):
            last = failing[-1]
            return last if math.isinf(last) else min(last, math.ceil(last * lengths[-1] / n))
        return min(failing[k - 1], failing[k])

    def device_ms(self, rows: int, length: int) -> float:
        """Interpolated median device time (ms) of one execution of `rows` rows x `length` tokens."""
        return self._device_ms(rows, self.length_of(length))

    # --- about the profile ----------------------------------------------------------------------

    @property
    def resolved_basis(self) -> str:
        """The interpolation in use: `tokens` or `grid` (what `auto` chose)."""
        return self._resolved

    @property
    def basis_errors(self) -> dict[str, float]:
        """Leave-one-out median relative error of each basis (empty unless `basis` is auto)."""
        return dict(self._basis_errors)

    def describe(self) -> str:
        """One line: the points, the basis and why, the limits."""
        rows = sorted({p.rows for p in self.points})
        lengths = sorted({p.length for p in self.points})
        why = ""
        if self._basis_errors:
            why = " (leave-one-out error " + ", ".join(
                f"{k} {v:.1%}" for k, v in sorted(self._basis_errors.items())) + ")"
        limits = [f"{r} rows at length {n}" for n, r in self.oom_rows]
        if self.oom_tokens is not None:
            limits.append(f"{self.oom_tokens} padded tokens")
        oom = "out of memory from " + ", ".join(limits) if limits else "no out-of-memory seen"
        return (f"{len(self.points)} points (rows {rows[0]}..{rows[-1]}, lengths {lengths[0]}..{lengths[-1]}), "
                f"basis {self._resolved}{why}; host {self.host_ms_per_row:g} ms/row + "
                f"{self.host_ms_per_execution:g} ms/execution + {self.host_ms_per_request:g} ms/request "
                f"after the first, overhead "
                f"{self.overhead_ms:g} ms/request, {oom}, "
                f"{self.concurrent_executions} concurrent execution(s)"
                + (f", {self.device_overlap:.0%} of device time overlapping" if self.device_overlap else ""))

    def to_frame(self) -> pd.DataFrame:
        """The points as a table (the CSV's body)."""
        return pd.DataFrame([[getattr(p, c) for c in COLUMNS] for p in self.points], columns=list(COLUMNS))

    @classmethod
    def from_function(cls, device_ms: Callable[[int, int], float], rows: Iterable[int],
                      lengths: Iterable[int], **settings) -> Profile:
        """A profile whose points are `device_ms(rows, length)` on the grid rows x lengths (no spread),
        leaving out sizes at or above `oom_tokens` or `oom_rows` (they cannot be measured)."""
        max_length, oom = settings.get("max_length"), settings.get("oom_tokens")
        failing = dict(settings.get("oom_rows", ()))
        points = []
        for r in rows:
            for n in lengths:
                effective = n if max_length is None else min(n, max_length)
                if (oom is not None and r * effective >= oom) or r >= failing.get(n, math.inf):
                    continue
                ms = float(device_ms(r, n))
                points.append(ProfilePoint(int(r), int(n), ms, ms, ms, 1))
        return cls(points=tuple(points), **settings)


# --- checks ----------------------------------------------------------------------------------------

_HEADER_KEYS = ("host_ms_per_row", "host_ms_per_execution", "host_ms_per_request", "overhead_ms", "oom_tokens",
                "oom_rows", "oom_ms", "max_length", "concurrent_executions", "device_overlap", "basis", "model",
                "model_digest")


def _check(p: Profile, where: str = "profile") -> None:
    if not p.points:
        raise ProfileError(f"{where}: no points (at least one measured execution size is needed)")
    for key in ("host_ms_per_row", "host_ms_per_execution", "host_ms_per_request", "overhead_ms", "oom_ms"):
        value = getattr(p, key)
        if not (isinstance(value, int | float) and math.isfinite(value) and value >= 0):
            raise ProfileError(f"{where}: {key} must be a number >= 0, got {value!r}")
    if not (isinstance(p.device_overlap, int | float) and 0 <= p.device_overlap < 1):
        raise ProfileError(f"{where}: device_overlap must be a number >= 0 and < 1, got {p.device_overlap!r}")
    for key in ("oom_tokens", "max_length", "concurrent_executions"):
        value = getattr(p, key)
        if value is None and key != "concurrent_executions":
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ProfileError(f"{where}: {key} must be an integer >= 1, got {value!r}")
    for length, rows in p.oom_rows:
        if length < 1 or rows < 1:
            raise ProfileError(f"{where}: oom_rows: lengths and rows must be >= 1, got {length}:{rows}")
    if len({n for n, _ in p.oom_rows}) < len(p.oom_rows):
        raise ProfileError(f"{where}: oom_rows: one limit per length, got {_oom_rows_text(p.oom_rows)}")
    if p.basis not in BASES:
        raise ProfileError(f"{where}: basis must be one of {', '.join(BASES)}, got {p.basis!r}")
    seen: dict[tuple[int, int], int] = {}
    for i, pt in enumerate(p.points):
        _check_point(pt, f"{where}: point {i + 1}")
        key = (pt.rows, pt.length)
        if key in seen:
            raise ProfileError(f"{where}: point {i + 1} (rows={pt.rows}, length={pt.length}) repeats "
                               f"point {seen[key] + 1}: one point per size")
        seen[key] = i
        if p.oom_tokens is not None and p.padded_tokens(pt.rows, pt.length) >= p.oom_tokens:
            raise ProfileError(
                f"{where}: point {i + 1} (rows={pt.rows}, length={pt.length}) is "
                f"{p.padded_tokens(pt.rows, pt.length)} padded tokens, at or above oom_tokens="
                f"{p.oom_tokens}: a measured point must have run")
        failing = dict(p.oom_rows).get(pt.length)
        if failing is not None and pt.rows >= failing:
            raise ProfileError(f"{where}: point {i + 1} (rows={pt.rows}, length={pt.length}) is at or above "
                               f"the {failing} rows that failed at length {pt.length} (oom_rows): a measured "
                               f"point must have run")


def _check_point(pt: ProfilePoint, where: str) -> None:
    for key in ("rows", "length", "count"):
        value = getattr(pt, key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ProfileError(f"{where}: {key} must be an integer >= 1, got {value!r}")
    for key in ("median_ms", "p10_ms", "p90_ms"):
        value = getattr(pt, key)
        if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
            raise ProfileError(f"{where}: {key} must be a number > 0, got {value!r}")
    if not pt.p10_ms <= pt.median_ms <= pt.p90_ms:
        raise ProfileError(f"{where}: p10_ms <= median_ms <= p90_ms must hold, but got "
                           f"(p10_ms={pt.p10_ms:g}, median_ms={pt.median_ms:g}, p90_ms={pt.p90_ms:g})")


# --- interpolation ---------------------------------------------------------------------------------


def _effective_points(points: tuple[ProfilePoint, ...], max_length: int | None
                      ) -> list[tuple[int, int, float]]:
    """(rows, truncated length, median ms); sizes that truncation makes equal share their median."""
    merged: dict[tuple[int, int], list[float]] = {}
    for p in points:
        length = p.length if max_length is None else min(p.length, max_length)
        merged.setdefault((p.rows, length), []).append(p.median_ms)
    return [(r, n, statistics.median(ms)) for (r, n), ms in sorted(merged.items())]


def _curve(xs: list[float], ys: list[float]) -> Callable[[float], float]:
    """Piecewise linear through (xs, ys) (xs increasing): flat below the first point, along the last
    segment above the last one (never downwards)."""
    first, last = ys[0], ys[-1]
    if len(xs) == 1:
        return lambda x: first
    slope = max((ys[-1] - ys[-2]) / (xs[-1] - xs[-2]), 0.0)
    x_first, x_last = xs[0], xs[-1]

    def f(x: float) -> float:
        if x <= x_first:
            return first
        if x >= x_last:
            return last + slope * (x - x_last)
        k = bisect.bisect_right(xs, x)
        x0, x1, y0, y1 = xs[k - 1], xs[k], ys[k - 1], ys[k]
        return y0 + (y1 - y0) * (x - x0) / (x1 - x0)

    return f


def _tokens_model(points: list[tuple[int, int, float]]) -> Callable[[int, int], float]:
    by_tokens: dict[int, list[float]] = {}
    for r, n, ms in points:
        by_tokens.setdefault(r * n, []).append(ms)
    xs = sorted(by_tokens)
    curve = _curve([float(x) for x in xs], [statistics.median(by_tokens[x]) for x in xs])
    return lambda rows, length: curve(float(rows * length))


def _grid_model(points: list[tuple[int, int, float]]) -> Callable[[int, int], float]:
    by_length: dict[int, list[tuple[int, float]]] = {}
    for r, n, ms in points:
        by_length.setdefault(n, []).append((r, ms))
    lengths = sorted(by_length)
    along_rows = [_curve([float(r) for r, _ in sorted(by_length[n])], [ms for _, ms in sorted(by_length[n])])
                  for n in lengths]
    if len(lengths) == 1:
        only = along_rows[0]
        return lambda rows, length: only(float(rows))

    def f(rows: int, length: int) -> float:
        if length <= lengths[0]:
            return along_rows[0](float(rows))
        k = min(max(bisect.bisect_right(lengths, length), 1), len(lengths) - 1)
        n0, n1 = lengths[k - 1], lengths[k]
        y0, y1 = along_rows[k - 1](float(rows)), along_rows[k](float(rows))
        if length >= n1:  # beyond the last length: along the last segment, never downwards
            return y1 + max(y1 - y0, 0.0) * (length - n1) / (n1 - n0)
        return y0 + (y1 - y0) * (length - n0) / (n1 - n0)

    return f


def _interpolator(points: list[tuple[int, int, float]], basis: str) -> Callable[[int, int], float]:
    return _grid_model(points) if basis == "grid" else _tokens_model(points)


def _cross_validate(points: list[tuple[int, int, float]]) -> dict[str, float]:
    """Median relative leave-one-out error of each basis; `grid` only where it differs from tokens
    (points at two lengths or more)."""
    if len(points) < 3:
        return {"tokens": 0.0}
    bases = ["tokens"] + (["grid"] if len({n for _, n, _ in points}) >= 2 else [])
    out = {}
    for basis in bases:
        errors = []
        for i, (r, n, ms) in enumerate(points):
            rest = points[:i] + points[i + 1:]
            errors.append(abs(_interpolator(rest, basis)(r, n) - ms) / ms)
        out[basis] = statistics.median(errors)
    return out


# --- file -----------------------------------------------------------------------------------------


def read_profile(path: str | os.PathLike, *, model: str | None = None) -> Profile:
    """Read and check a profile CSV (see the module docstring for the format). With `model`, a
    profile whose `# model:` header names another model is refused: its times are another model's."""
    path = Path(path)
    text = read_text(path, error=ProfileError)
    header: dict[str, str] = {}
    body: list[str] = []
    body_lines: list[int] = []
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if stripped.startswith("#"):
            if stripped == FORMAT_LINE or ":" not in stripped:
                continue
            key, value = (s.strip() for s in stripped[1:].split(":", 1))
            if key not in _HEADER_KEYS:
                raise ProfileError(f"{path}:{number}: {key}: unknown key (expected one of: "
                                   f"{', '.join(_HEADER_KEYS)})")
            header[key] = value
        elif stripped:
            body.append(line)
            body_lines.append(number)
    if not body:
        raise ProfileError(f"{path}: no points (a header row rows,length,median_ms,... and one row per "
                           f"measured execution size are needed)")
    try:
        frame = pd.read_csv(io.StringIO("\n".join(body)), skipinitialspace=True)
    except (pd.errors.ParserError, ValueError) as exc:
        raise ProfileError(f"{path}: not a readable CSV table ({first_line(exc)})") from None
    missing = [c for c in REQUIRED_COLUMNS if c not in frame.columns]
    if missing:
        raise ProfileError(f"{path}: missing column {missing[0]!r} (columns found: "
                           f"{', '.join(map(str, frame.columns))}; expected {', '.join(COLUMNS)})")
    unknown = [c for c in frame.columns if c not in COLUMNS]
    if unknown:
        raise ProfileError(f"{path}: unknown column {unknown[0]!r} (expected {', '.join(COLUMNS)})")
    if frame.empty:
        raise ProfileError(f"{path}: no points (a header row but no measured execution sizes)")
    points = []
    for i, row in enumerate(frame.itertuples(index=False)):
        where = f"{path}:{body_lines[i + 1]}"
        values = row._asdict()
        try:
            rows, length = _int(values["rows"], "rows"), _int(values["length"], "length")
            median = _float(values["median_ms"], "median_ms")
            p10 = _float(values.get("p10_ms", median), "p10_ms", default=median)
            p90 = _float(values.get("p90_ms", median), "p90_ms", default=median)
            count = _int(values.get("count", 1), "count", default=1)
            point = ProfilePoint(rows, length, median, p10, p90, count)
            _check_point(point, where)
        except ProfileError as exc:
            msg = str(exc)
            raise ProfileError(msg if msg.startswith(str(path)) else f"{where}: {msg}") from None
        points.append(point)
    settings = {key: _header_value(key, value, path) for key, value in header.items()}
    measured_on = settings.get("model")
    if model is not None and measured_on and measured_on != model:
        raise ProfileError(f"{path}: measured on model {measured_on}, not {model}")
    try:
        return Profile(points=tuple(points), **settings)
    except ProfileError as exc:
        raise ProfileError(str(exc).replace("profile: ", f"{path}: ", 1)) from None


def profile_text(profile: Profile) -> str:
    """The profile as the CSV file's text: the header keys, then the points."""
    lines = [FORMAT_LINE]
    for key in _HEADER_KEYS:
        value = getattr(profile, key)
        if value is None or (key in ("model", "model_digest", "oom_rows") and not value):
            continue
        lines.append(f"# {key}: {_oom_rows_text(value) if key == 'oom_rows' else value}")
    return "\n".join(lines) + "\n" + profile.to_frame().to_csv(index=False, float_format="%.6g")


def write_profile(profile: Profile, path: str | os.PathLike) -> Path:
    """Write `profile` as CSV with its header keys, whole or not at all; returns the path."""
    return write_atomic(path, profile_text(profile), label=f"profile {path}", error=ProfileError)


def _header_value(key: str, value: str, path: Path):
    kinds = {f.name: f.type for f in fields(Profile)}
    text = value.strip()
    if key in ("basis", "model", "model_digest"):
        return text
    if key == "oom_rows":
        return _oom_rows(text, path)
    if text.lower() in ("", "none"):
        if key in ("oom_tokens", "max_length"):
            return None
        raise ProfileError(f"{path}: {key}: a value is required")
    try:
        if "int" in str(kinds[key]):
            return int(text)
        return float(text)
    except ValueError:
        want = "an integer" if "int" in str(kinds[key]) else "a number"
        raise ProfileError(f"{path}: {key}: expected {want}, got {text!r}") from None


def _oom_rows_text(pairs) -> str:
    return ", ".join(f"{n}:{r}" for n, r in pairs)


def _oom_rows(text: str, path: Path) -> tuple[tuple[int, int], ...]:
    """`length:rows, ...` (empty: none)."""
    pairs = []
    for item in filter(None, (s.strip() for s in text.split(","))):
        length, _, rows = item.partition(":")
        try:
            pairs.append((int(length), int(rows)))
        except ValueError:
            raise ProfileError(f"{path}: oom_rows: expected length:rows pairs separated by commas "
                               f"(e.g. 256:65, 512:33), got {item!r}") from None
    return tuple(pairs)


def _int(value, name: str, default: int | None = None) -> int:
    return _cell(value, name, parse=_whole, want="an integer >= 1", default=default)


def _float(value, name: str, default: float | None = None) -> float:
    return _cell(value, name, parse=float, want="a number > 0", default=default)


def _cell(value, name: str, *, parse: Callable, want: str, default):
    """One CSV cell as `parse` reads it; an empty cell (NaN) or absent column is `default`, if any."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        if default is not None:
            return default
        raise ProfileError(f"{name}: a value is required")
    try:
        return parse(value)
    except (TypeError, ValueError):
        raise ProfileError(f"{name} must be {want}, got {value!r}") from None


def _whole(value) -> int:
    if isinstance(value, float) and value.is_integer():  # a column with an empty cell reads as floats
        return int(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return int(value)
    return int(str(value).strip())  # 4.5, True and text are refused
