"""Plain-HTTP calls to Triton's control plane, shared by the launchers.

urllib rather than tritonclient.http: the latter is gevent-based and its client objects must not cross
OS threads; these calls are few and small, so blocking stdlib HTTP with short timeouts is simpler.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable

from tuner import modelconfig, space
from tuner.errors import ServerError, ServerSetupError
from tuner.modelconfig import ModelConfig


class HttpError(Exception):
    """Triton answered with an HTTP error status; `message` is its JSON `error` text."""

    def __init__(self, status: int, message: str):
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.message = message


class TritonHttp:
    """Blocking JSON calls against `http://host:port`. Connection problems raise ServerError."""

    def __init__(self, address: str, timeout_s: float = 5.0):
        self.base = address if address.startswith(("http://", "https://")) else f"http://{address}"
        self.base = self.base.rstrip("/")
        self.timeout_s = timeout_s

    def request(self, method: str, path: str, body: dict | None = None, timeout_s: float | None = None,
                url: str | None = None) -> bytes:
        """The body of the answer to `method` on `path` (or `url`); HttpError on an error status."""
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(url or f"{self.base}/{path.lstrip('/')}", data=data, method=method,
                                     headers={"Content-Type": "application/json"} if data else {})
        try:
            with urllib.request.urlopen(req, timeout=timeout_s or self.timeout_s) as resp:
                return resp.read()
        except urllib.error.HTTPError as exc:
            raw = exc.read().decode(errors="replace")
            try:
                message = json.loads(raw).get("error", raw)
            except (ValueError, AttributeError):
                message = raw
            raise HttpError(exc.code, message or exc.reason) from None
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise ServerError(f"Triton at {self.base} did not answer {method} /{path.lstrip('/')}: {reason}") from None

    def get_json(self, path: str, timeout_s: float | None = None) -> dict:
        """The JSON answer to a GET of `path` (an empty dict for an empty body)."""
        return json.loads(self.request("GET", path, timeout_s=timeout_s) or b"{}")

    def post_json(self, path: str, body: dict | None = None, timeout_s: float | None = None) -> dict:
        """The JSON answer to a POST of `body` to `path` (an empty dict for an empty body)."""
        raw = self.request("POST", path, body=body if body is not None else {}, timeout_s=timeout_s)
        return json.loads(raw) if raw.strip() else {}

    def ok(self, path: str, timeout_s: float = 1.0) -> bool:
        """Whether a GET of `path` succeeds within `timeout_s`."""
        try:
            self.request("GET", path, timeout_s=timeout_s)
            return True
        except (HttpError, ServerError):
            return False

    # --- the calls every launcher makes ------------------------------------------------------------

    def model_config(self, model: str) -> ModelConfig:
        """The configuration the server runs for `model`; ServerSetupError when it has none."""
        try:
            return modelconfig.from_json(self.get_json(f"v2/models/{model}/config"))
        except HttpError as exc:
            raise ServerSetupError(f"model '{model}': the server has no configuration for it: {exc.message}") from None

    def statistics(self, model: str) -> dict:
        """The model's entry of `v2/models/<model>/stats`; ServerSetupError when it has none."""
        try:
            stats = self.get_json(f"v2/models/{model}/stats").get("model_stats", [])
        except HttpError as exc:
            raise ServerSetupError(f"model '{model}': no statistics: {exc.message}") from None
        for entry in stats:
            if entry.get("name") == model:
                return entry
        raise ServerSetupError(f"model '{model}': no statistics (is it loaded?)")

    def metrics(self, url: str) -> dict[str, float]:
        """The Prometheus metrics at `url`, summed by name."""
        return parse_prometheus(self.request("GET", "metrics", url=url).decode(errors="replace"))

    def load(self, model: str, config: ModelConfig | None, timeout_s: float) -> None:
        """Repository load with `config` as the override (HttpError if Triton refuses)."""
        body = {"parameters": {"config": modelconfig.to_json(config)}} if config is not None else {}
        self.post_json(f"v2/repository/models/{model}/load", body, timeout_s=timeout_s)


def apply_and_verify(http: TritonHttp, model: str, config: ModelConfig, timeout_s: float,
                     explain_refusal: Callable[[str], str]) -> ModelConfig:
    """Load `model` with `config`, read it back, and fail loudly on any difference in a tuned field."""
    try:
        http.load(model, config, timeout_s=timeout_s)
    except HttpError as exc:
        raise ServerSetupError(f"model '{model}': Triton refused the configuration: {explain_refusal(exc.message)}") from None
    running = http.model_config(model)
    mismatches = compare_tuned_fields(config, running)
    if mismatches:
        field, asked, got = mismatches[0]
        raise ServerSetupError(f"model '{model}': asked for {field}={asked} but the server runs {field}={got}")
    return running


def compare_tuned_fields(asked: ModelConfig, running: ModelConfig) -> list[tuple[str, object, object]]:
    """(field, asked, running) for each tuned field the running config does not match.

    A preferred_batch_size left empty in the request may be filled in by Triton's auto-complete, so it
    is compared only when asked for. An instance count of 0 in the request means Triton's default.
    """
    want, have = space.config_fields(asked), space.config_fields(running)
    out = []
    for field, value in want.items():
        got = have.get(field)
        if field == "dynamic_batching.preferred_batch_size" and not value:
            continue
        if field == "instance_group.count" and isinstance(got, list) and len(got) == len(value):
            value = [w or g for w, g in zip(value, got, strict=True)]  # 0 asks for Triton's default
        if got is None and field.startswith("dynamic_batching"):
            got = "(no dynamic_batching)"
        if value != got:
            out.append((field, value, got))
    return out


def parse_prometheus(text: str) -> dict[str, float]:
    """Prometheus text exposition summed by metric name (labels dropped)."""
    totals: dict[str, float] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if "{" in line:
            name, rest = line.split("{", 1)
            rest = rest.rsplit("}", 1)[-1]
        else:
            name, _, rest = line.partition(" ")
        parts = rest.split()
        if not parts:
            continue
        try:
            value = float(parts[0])
        except ValueError:
            continue
        totals[name.strip()] = totals.get(name.strip(), 0.0) + value
    return totals
