"""The emulated GPU (`model_repository_templates/encoder_sim`) seen from outside the server: its
model.py's pure functions, and the execution-time profile its config.pbtxt declares.

A helper of the benchmarks and the tests (`from benchmarks.encoder_sim import profile`), not a
benchmark: what `tuner profile` would measure on the emulated GPU, computed by the emulation's own
functions, so that a simulation can be compared with it without measuring.
"""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

from tuner import modelconfig
from tuner.simulate import Profile

__all__ = ["CONFIG", "ROWS", "LENGTHS", "emulation", "profile"]

TEMPLATE = Path(__file__).resolve().parents[1] / "model_repository_templates" / "encoder_sim"
CONFIG = TEMPLATE / "config.pbtxt"
ROWS = (1, 2, 3, 4, 6, 8, 11, 16, 23, 32, 45, 64)  # half octaves
LENGTHS = (16, 32, 64, 128, 256, 384, 512)


def emulation() -> types.ModuleType:
    """encoder_sim's model.py, for its pure functions (`parse_table`, `execute_ms`, ...): the import
    that only exists inside the server (triton_python_backend_utils) is stubbed."""
    sys.modules.setdefault("triton_python_backend_utils", types.ModuleType("triton_python_backend_utils"))
    spec = importlib.util.spec_from_file_location("encoder_sim_model", TEMPLATE / "1" / "model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def profile(config_path: str | Path = CONFIG, *, factor: float = 1.0, rows=ROWS, lengths=LENGTHS) -> Profile:
    """The emulated GPU's execution times under `config_path`'s parameters (its latency table, time
    scale, memory-bound slowdown, padded-token budget, host time per request) as a profile on the grid
    rows x lengths; every execution `factor` times as long (other than 1: a profile that lies)."""
    config = modelconfig.load(config_path)
    params = {k: v.string_value for k, v in config.parameters.items()}
    model = emulation()
    tokens, ms = model.parse_table(params["latency_table_ms"])
    scale = float(params["time_scale"])
    knee, slowdown = float(params["memory_bound_tokens"]), float(params["memory_bound_slowdown"])
    max_length = int(params["max_sequence_length"])

    def device_ms(r: int, length: int) -> float:
        return factor * scale * model.execute_ms(r * min(length, max_length), tokens, ms, knee, slowdown)

    return Profile.from_function(
        device_ms, rows=rows, lengths=lengths,
        host_ms_per_row=float(params["host_us_per_request"]) * 1e-3 * scale,
        oom_tokens=int(params["max_padded_tokens"]) + 1, oom_ms=float(params["oom_ms"]) * scale,
        max_length=max_length, model=config.name)
