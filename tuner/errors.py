"""The errors `tuner` raises on purpose, and the exit code each maps to.

    TunerError                      exit 1: anything not the user's input
    ├── InputError                  exit 2: bad input, said in one line
    │   ├── ConfigError             a config.pbtxt that does not parse or breaks a Triton rule
    │   ├── TrafficError            a traffic file that cannot be used
    │   ├── SettingsError           a study or nightly YAML that cannot be used
    │   ├── OutputError             an output that cannot be written (a read-only or full file system,
    │   │                           a directory in the way, a name too long)
    │   ├── ProfileError            a model profile (execution times) that cannot be used
    │   ├── UnmodelledError         a config.pbtxt setting the batcher simulation does not model
    │   │                           (search.strategy model, tuner simulate)
    │   └── ServerSetupError        no server to talk to: unreachable, model missing, port in use,
    │                               config refused by Triton, binary not installable
    ├── ServerError                 the server died or misbehaved in the middle of the work
    ├── ReplayError                 the load generator failed (not the server)
    ├── UnmeasuredError             the load generator could not keep its send-lag budget in any trial
    └── NoFeasibleConfigError       exit 3: no configuration met the SLA

    KeyboardInterrupt               exit 130: Ctrl-C
    └── Terminated                  exit 143: SIGTERM (a scheduler stopping the job), handled alike

The commands that give a verdict exit with a code a scheduler can act on, defined here once (`tuner
audit` and the nightly rule take them from here; `tuner soak` exits alike, 10 on drift):

    EXIT_OK          0   nothing to do: healthy, keep production, no drift
    EXIT_SLA_UNMET   3   the SLA cannot be met (as NoFeasibleConfigError)
    EXIT_ACT         10  act on it: inefficient, a change proposed, drift
"""

from __future__ import annotations

import contextlib
import difflib
import signal
import threading
from collections.abc import Iterable, Iterator


class TunerError(Exception):
    exit_code = 1


class InputError(TunerError):
    exit_code = 2


class ConfigError(InputError):
    pass


class TrafficError(InputError):
    pass


class SettingsError(InputError):
    pass


class ServerSetupError(InputError):
    pass


class OutputError(InputError):
    pass


class ProfileError(InputError):
    pass


class UnmodelledError(InputError):
    pass


class ServerError(TunerError):
    pass


class ReplayError(TunerError):
    pass


class UnmeasuredError(TunerError):
    pass


class NoFeasibleConfigError(TunerError):
    exit_code = 3


EXIT_OK = 0
EXIT_SLA_UNMET = NoFeasibleConfigError.exit_code
EXIT_ACT = 10


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the process is, so that it unwinds like Ctrl-C: the trial in flight is
    marked failed (the next run measures it again), servers and containers are stopped."""


def traffic_row(traffic, i: int) -> str:
    """Row `i` (by position) of a traffic table (pandas) as the user counts it: from 1, as a CSV's data
    rows below its header (the table's index counts them from 0 as `read_traffic` leaves it: in time
    order), with its timestamp, which finds the row in any file."""
    stamp = f", timestamp {traffic['timestamp'].iloc[i]}" if "timestamp" in traffic.columns else ""
    return f"traffic row {int(traffic.index[i]) + 1}{stamp}"


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """`did you mean X?` for the choice `word` most likely misspells (`nearest`), or '' when none is
    close: the one way a refusal of an unknown name suggests the known one."""
    near = nearest(word, choices)
    return f"did you mean {near}?" if near is not None else ""


def nearest(word: str, choices: Iterable[str]) -> str | None:
    """The choice `word` most likely misspells (difflib's closest match, letters' case aside: `BERT` for
    `bert`), None when none is close."""
    choices = list(choices)
    by_case = {}
    for choice in choices:
        by_case.setdefault(choice.casefold(), choice)
    near = difflib.get_close_matches(word.casefold(), list(by_case), n=1)
    return by_case[near[0]] if near else None


def _raise_terminated(signum, frame) -> None:
    raise Terminated()


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Within the block, SIGTERM raises `Terminated` (main thread only; elsewhere a no-op)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
