"""A client of Prometheus's HTTP query API (`/api/v1/query`, `/api/v1/query_range`, label values):
any Prometheus-compatible API (Thanos, Mimir, VictoriaMetrics) answers the same requests.

Every failure is one line naming the URL (a PrometheusError): unreachable, not a Prometheus API (a
page or another server's JSON), no answer within the timeout, a query refused.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request

from tuner.production._errors import PrometheusError

__all__ = ["TIMEOUT_S", "Prometheus", "normalise_url"]

TIMEOUT_S = 30.0  # one query's answer; a week at an hour's step answers in well under a second


def normalise_url(url: str) -> str:
    """`http://host:9090` from `host:9090` or `http://host:9090/`; PrometheusError for anything else."""
    text = url.strip()
    if "://" not in text:
        text = "http://" + text
    text = text.rstrip("/") if not text.endswith("://") else text
    parts = urllib.parse.urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise PrometheusError(
            f"--prometheus {url!r}: not an http(s) URL (give it like http://prometheus:9090)"
        )
    try:
        parts.port  # noqa: B018 - raises on a port that is not a number
    except ValueError:
        raise PrometheusError(f"--prometheus {url!r}: the port is not a number") from None
    return text


class Prometheus:
    """The query API at `url` (its root, as `http://prometheus:9090`; a path prefix is kept)."""

    def __init__(self, url: str, *, timeout_s: float | None = None):
        self.url = normalise_url(url)
        # read at construction, not bound at import: the commands' default can be changed (the tests)
        self.timeout_s = TIMEOUT_S if timeout_s is None else timeout_s

    def check(self) -> None:
        """PrometheusError unless `url` answers a query as Prometheus's API does."""
        self.query("1")

    def query(self, promql: str, *, at: float | None = None) -> list[dict]:
        """An instant query's result (a list of {metric, value})."""
        params = {"query": promql} | ({} if at is None else {"time": f"{at:.3f}"})
        return self._data("/api/v1/query", params)["result"]

    def query_range(self, promql: str, *, start: float, end: float, step_s: float) -> list[dict]:
        """A range query's result (a list of {metric, values}): points at start, start + step, ... end."""
        params = {"query": promql, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step_s:g}"}
        return self._data("/api/v1/query_range", params)["result"]

    def label_values(self, label: str, *, match: str, start: float, end: float) -> list[str]:
        """The values `label` takes on the series `match` selects between start and end."""
        params = {"match[]": match, "start": f"{start:.3f}", "end": f"{end:.3f}"}
        return list(self._data(f"/api/v1/label/{urllib.parse.quote(label)}/values", params))

    def retention(self) -> str | None:
        """The server's `storageRetention` (`15d`, `15d or 10GiB`), or None where the API does not say
        (a Prometheus-compatible store without Prometheus's status endpoint)."""
        try:
            info = self._data("/api/v1/status/runtimeinfo", {})
        except PrometheusError:
            return None
        value = info.get("storageRetention") if isinstance(info, dict) else None
        return str(value) if value else None

    def _data(self, path: str, params: dict):
        url = f"{self.url}{path}?{urllib.parse.urlencode(params)}"
        where = f"--prometheus {self.url}"
        try:
            with urllib.request.urlopen(url, timeout=self.timeout_s) as response:
                body = response.read()
        except urllib.error.HTTPError as exc:
            # Prometheus answers a bad query with 400/422 and its own JSON error; anything else is not it
            body = exc.read()
            answer = _json(body)
            if isinstance(answer, dict) and answer.get("status") == "error" and "error" in answer:
                raise PrometheusError(
                    f"{where}: the query was refused ({exc.code}): {answer['error']}"
                ) from None
            raise PrometheusError(
                f"{where}: not a Prometheus query API (GET {path} answered HTTP {exc.code})"
            ) from None
        except TimeoutError:
            raise PrometheusError(f"{where}: no answer within {self.timeout_s:g} s (a timeout)") from None
        except urllib.error.URLError as exc:
            if isinstance(exc.reason, TimeoutError):
                raise PrometheusError(f"{where}: no answer within {self.timeout_s:g} s (a timeout)") from None
            raise PrometheusError(f"{where}: unreachable ({exc.reason})") from None
        except (ConnectionError, OSError) as exc:
            raise PrometheusError(f"{where}: unreachable ({exc})") from None
        answer = _json(body)
        if not isinstance(answer, dict) or answer.get("status") != "success" or "data" not in answer:
            raise PrometheusError(
                f"{where}: not a Prometheus query API (GET {path} answered no "
                f'{{"status": "success", "data": ...}})'
            )
        return answer["data"]


def _json(body: bytes):
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None
