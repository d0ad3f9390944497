"""The errors `tuner` raises on purpose, and the exit code each maps to.

    TunerError                      exit 1: anything not the user's input
    ├── InputError                  exit 2: bad input, said in one line
    │   ├── ConfigError             a config.pbtxt that does not parse or breaks a Triton rule
    │   ├── TrafficError            a traffic file that cannot be used
    │   ├── SettingsError           a study or nightly YAML that cannot be used
    │   └── ServerSetupError        no server to talk to: unreachable, model missing, port in use,
    │                               config refused by Triton, binary not installable
    ├── ServerError                 the server died or misbehaved in the middle of the work
    ├── ReplayError                 the load generator failed (not the server)
    └── NoFeasibleConfigError       exit 3: no configuration met the SLA
"""

from __future__ import annotations


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


class ServerError(TunerError):
    pass


class ReplayError(TunerError):
    pass


class NoFeasibleConfigError(TunerError):
    exit_code = 3
