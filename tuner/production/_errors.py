"""The production audit's bad inputs, each said in one line (exit 2, as every InputError)."""

from __future__ import annotations

from tuner.errors import InputError, ServerSetupError

__all__ = ["NoSeriesError", "PrometheusError", "TritonMetricsError", "WindowError"]


class PrometheusError(ServerSetupError):
    """No Prometheus query API to read: unreachable, not a Prometheus API, a timeout, a refused query."""


class WindowError(InputError):
    """A --window that cannot be audited: not a duration, under an hour, longer than the retention."""


class NoSeriesError(InputError):
    """Nothing to audit: no Triton metrics in Prometheus, or none for the study's model."""


class TritonMetricsError(ServerSetupError):
    """A --triton metrics port that cannot be read: unreachable, not Triton's metrics, no series of the model."""
