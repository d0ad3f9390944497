"""Plain-HTTP calls to Triton's control plane, shared by the launchers.

urllib rather than tritonclient.http: the latter is gevent-based and its client objects must not cross
OS threads; these calls are few and small, so blocking stdlib HTTP with short timeouts is simpler.
"""

from __future__ import annotations

import base64
import http.client
import json
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping

from tuner import modelconfig, space
from tuner.errors import ServerError, ServerSetupError
from tuner.modelconfig import ModelConfig


class HttpError(Exception):
    """Triton answered with an HTTP error status; `message` is its JSON `error` text."""

    def __init__(self, status: int, message: str):
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.message = message


class NotTritonError(ServerError):
    """Something answered, but not as Triton's HTTP endpoint does: a body that is not JSON, a status
    line that is not HTTP/1.x (a gRPC or other HTTP/2-only port), a connection reset or closed
    without an answer. `what` says what came back; `call` is the request (`GET /v2`)."""

    def __init__(self, base: str, call: str, what: str):
        super().__init__(f"Triton at {base}: {call}: {what}")
        self.base = base
        self.call = call
        self.what = what


class TritonHttp:
    """Blocking JSON calls against `http://host:port`. Connection problems raise ServerError, an
    answer that is not Triton's NotTritonError (a ServerError too)."""

    def __init__(self, address: str, timeout_s: float = 5.0):
        self.base = address if address.startswith(("http://", "https://")) else f"http://{address}"
        self.base = self.base.rstrip("/")
        self.timeout_s = timeout_s

    def request(self, method: str, path: str, body: dict | None = None, *, timeout_s: float | None = None,
                url: str | None = None) -> bytes:
        """The body of the answer to `method` on `path` (or `url`); HttpError on an error status."""
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(url or f"{self.base}/{path.lstrip('/')}", data=data, method=method,
                                     headers={"Content-Type": "application/json"} if data else {})
        call = f"{method} /{path.lstrip('/')}"
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
        except (http.client.HTTPException, ConnectionResetError) as exc:
            # something listens there but does not speak HTTP/1.1 back (BadStatusLine, UnknownProtocol, ...)
            raise NotTritonError(self.base, call, _what_answered(exc)) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            if isinstance(reason, ConnectionResetError):  # reset while the request was sent
                raise NotTritonError(self.base, call, _what_answered(reason)) from None
            raise ServerError(f"Triton at {self.base} did not answer {call}: {reason}") from None

    def get_json(self, path: str, timeout_s: float | None = None) -> dict:
        """The JSON object Triton answers to a GET of `path` (every GET it answers in JSON gives an
        object, never an empty body); NotTritonError otherwise."""
        return _json_object(self.request("GET", path, timeout_s=timeout_s), self.base, f"GET /{path.lstrip('/')}")

    def post_json(self, path: str, body: dict | None = None, timeout_s: float | None = None) -> dict:
        """The JSON answer to a POST of `body` to `path` (an empty dict for an empty body: a load or
        an unload answers nothing)."""
        raw = self.request("POST", path, body=body if body is not None else {}, timeout_s=timeout_s)
        return _json_object(raw, self.base, f"POST /{path.lstrip('/')}") if raw.strip() else {}

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

    def load(self, model: str, config: ModelConfig | None, timeout_s: float, *,
             files: Mapping[str, bytes] | None = None) -> None:
        """Repository load with `config` as the override (HttpError if Triton refuses). `files`
        (`{"file:1/model.json": bytes, ...}`, sent base64 as Triton's load API takes them) replace
        the model's directory on the server for this load: it is loaded from them and `config`."""
        params: dict[str, str] = {}
        if config is not None:
            params["config"] = modelconfig.to_json(config)
        for key, data in (files or {}).items():
            params[key] = base64.b64encode(data).decode("ascii")
        body = {"parameters": params} if params else {}
        self.post_json(f"v2/repository/models/{model}/load", body, timeout_s=timeout_s)

    def unload(self, model: str, timeout_s: float) -> None:
        """Repository unload of `model` (HttpError if Triton refuses)."""
        self.post_json(f"v2/repository/models/{model}/unload", {}, timeout_s=timeout_s)


def _json_object(raw: bytes, base: str, call: str) -> dict:
    """`raw` as a JSON object; NotTritonError saying what it was instead."""
    if not raw.strip():
        raise NotTritonError(base, call, "an empty answer, not JSON")
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise NotTritonError(base, call, f"not JSON: {_excerpt(raw)}") from None
    if not isinstance(data, dict):
        raise NotTritonError(base, call, f"JSON but not an object: {_excerpt(raw)}")
    return data


def _what_answered(exc: Exception) -> str:
    """What a peer that broke HTTP/1.1 sent, in words."""
    if isinstance(exc, http.client.RemoteDisconnected):
        return "the connection was closed without an answer"
    if isinstance(exc, ConnectionResetError):
        return "the connection was reset without an answer"
    if isinstance(exc, http.client.UnknownProtocol):
        return f"an answer in {exc.args[0] if exc.args else 'another protocol'}, not HTTP/1.1"
    if isinstance(exc, http.client.BadStatusLine):
        line = str(exc.args[0] if exc.args else "")
        if _is_http2_frame(line.encode("latin-1", errors="replace")):
            return "an HTTP/2 frame, as a gRPC port sends, not HTTP/1.1"
        return f"not an HTTP status line: {_excerpt(line.encode('latin-1', errors='replace'))}"
    return f"a broken HTTP answer ({type(exc).__name__}: {_excerpt(str(exc).encode())})"


def _is_http2_frame(head: bytes) -> bool:
    """Whether `head` starts like the first frame an HTTP/2 server sends: SETTINGS or GOAWAY on
    stream 0 (the 9-byte frame header: 3 bytes of length, the type, the flags, the stream)."""
    return len(head) >= 9 and head[3] in (0x04, 0x07) and head[5:9] == b"\0\0\0\0"


def _excerpt(raw: bytes, limit: int = 40) -> str:
    """The start of an answer, quoted, short enough for a one-line error."""
    text = raw[:limit].decode("utf-8", errors="replace").strip()
    return repr(text) + ("..." if len(raw) > limit else "")


def apply_and_verify(http: TritonHttp, model: str, config: ModelConfig, *, timeout_s: float,
                     explain_refusal: Callable[[str], str], files: Mapping[str, bytes] | None = None,
                     fresh: bool = False) -> ModelConfig:
    """Load `model` with `config` (and `files`, the model directory's overrides), read it back, and
    fail loudly on any difference in a tuned field. `fresh`: unload it first, so that its files are
    read again (Triton 2.51 keeps a model loaded from file overrides when the next load's overrides
    differ only in a file's content, and skips a reload it judges by modification times)."""
    try:
        if fresh:
            http.unload(model, timeout_s=timeout_s)
        http.load(model, config, timeout_s=timeout_s, files=files)
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
