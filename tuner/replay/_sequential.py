"""Requests one after another, each waiting for the last (closed loop), from an ordinary process: the
warm-up's shape sweep, where every request must run as its own execution; and a few requests sent at
once (`send_together`), for the profile's batches of separate requests. Parent side, unpatched:
`_http` is plain `socket` code here."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import pandas as pd

from tuner.replay import _http, _plan


@dataclass(frozen=True)
class Sent:
    """What a closed-loop series of requests did."""

    requests: int
    errors: int
    seconds: float
    first_error: str = ""


def check_fits(http: str, model: str, traffic: pd.DataFrame) -> None:
    """TrafficError naming the row (of `traffic` itself) when a row does not fit the model's inputs
    or no request could carry it: said before any warm-up or replay works on it."""
    metadata, config = _plan.model_info(http, model)
    _plan.plan_requests(metadata, config, traffic)


def send_one_by_one(http: str, model: str, traffic: pd.DataFrame, *, timeout_s: float = 30.0,
                    drop_oversize: bool = False) -> Sent:
    """Send each row of `traffic` as one request (its shape from the row, as the replay makes it),
    each after the previous answer; returns the counts. Errors (an out-of-memory, a refused shape) are
    counted, not raised: a warm-up goes on past them. `drop_oversize`: rows above the replay's size
    limit per request are left out (`_plan.plan_requests`), as a warm-up's synthetic rows may be."""
    metadata, config = _plan.model_info(http, model)
    plan = _plan.plan_requests(metadata, config, traffic, drop_oversize=drop_oversize)
    inputs = [(i.name, i.datatype) for i in plan.inputs]
    longest = [max((math.prod(shape[k]) for shape in plan.shapes), default=0) for k in range(len(inputs))]
    data = [memoryview(_http.tensor_data(datatype, n, seed=k))
            for k, ((_, datatype), n) in enumerate(zip(inputs, longest, strict=True))]
    connections = _http.Connections(http, timeout_s=timeout_s)
    errors, first_error = 0, ""
    started = time.monotonic()
    try:
        for shape_id in plan.shape_ids.tolist():
            shapes = plan.shapes[shape_id]
            parts = _http.infer_request(
                http, plan.model, [(name, datatype, shape) for (name, datatype), shape in zip(inputs, shapes, strict=True)],
                outputs=plan.outputs, data=[buf[:math.prod(shape) * _http.ITEMSIZE[datatype]]
                               for buf, (_, datatype), shape in zip(data, inputs, shapes, strict=True)])
            try:
                status, body = connections.post(parts)
            except OSError as exc:
                status, body = 0, str(exc).encode()
            if status != 200:
                errors += 1
                first_error = first_error or _http.error_text(status, body)
    finally:
        connections.close()
    return Sent(len(plan.shape_ids), errors, time.monotonic() - started, first_error)


def send_together(http: str, model: str, traffic: pd.DataFrame, *, timeout_s: float = 30.0,
                  first_alone_s: float | None = None) -> Sent:
    """Send every row of `traffic` as one request, all at once: each on its own connection, opened
    before any is sent, written one after another from this thread (`_http.exchange_together`); returns
    when all are answered. With `first_alone_s`, the first row goes alone and the others together that
    many seconds later."""
    metadata, config = _plan.model_info(http, model)
    plan = _plan.plan_requests(metadata, config, traffic)
    inputs = [(i.name, i.datatype) for i in plan.inputs]
    requests = []
    for shape_id in plan.shape_ids.tolist():
        shapes = plan.shapes[shape_id]
        data = [_http.tensor_data(datatype, math.prod(shape), seed=k)
                for k, ((_, datatype), shape) in enumerate(zip(inputs, shapes, strict=True))]
        requests.append(_http.infer_request(
            http, plan.model, [(name, datatype, shape) for (name, datatype), shape in zip(inputs, shapes, strict=True)],
            outputs=plan.outputs, data=data))
    answers, seconds = _http.exchange_together(http, requests, timeout_s=timeout_s, first_alone_s=first_alone_s)
    failed = [(status, body) for status, body in answers if status != 200]
    first_error = _http.error_text(*failed[0]) if failed else ""
    return Sent(len(requests), len(failed), seconds, first_error)
