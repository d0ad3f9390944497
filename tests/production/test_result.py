"""The production audit's findings table (tuner/production/_result.py) from hand-made counters: no
Prometheus, the answers worked out here."""

from __future__ import annotations

import pandas as pd

from tuner.production._audit import judge
from tuner.production._figures import COLUMNS, SECONDS
from tuner.production._series import Counters

END = pd.Timestamp("2026-01-01 01:00", tz="UTC")


def one_hour(rows: list[tuple]) -> Counters:
    """One hour's step: (instance, succeeded, seconds served) rows, batches of 10, no failures."""
    frame = pd.DataFrame(
        [(END, instance, ok, 0, ok, ok / 10, ok * 1000, ok * 2000, served) for instance, ok, served in rows],
        columns=["end", "instance", *COLUMNS, SECONDS],
    ).set_index(["end", "instance"])
    return Counters(increases=frame, ends=pd.DatetimeIndex([END]), resets={})


def audit(counters: Counters):
    start = (END - pd.Timedelta(hours=1)).timestamp()
    return judge(counters, model="m", prometheus="http://p", start=start, end=END.timestamp(), step_s=3600.0,
                 max_batch_size=32, price_per_hour=1.0, max_error_rate=0.001)


def test_an_instance_that_served_part_of_its_only_step_counts_that_step():
    # the second replica started 23 min before the hour's end: 1,400 s of one step (0.39 of it)
    a = audit(one_hour([("127.0.0.1:8002", 36000, 3600.0), ("127.0.0.1:28002", 12320, 1400.0)]))
    lines = [f.value for f in a.findings]
    assert any(v.startswith("127.0.0.1:28002: 8.8 req/s") and v.endswith(", 1 step with samples") for v in lines), lines
    assert any(v.startswith("127.0.0.1:8002: 10.0 req/s") and v.endswith(", 1 step with samples") for v in lines), lines
    window = next(f for f in a.findings if f.check == "production window")
    assert window.why == "1 step of 1h with samples"
    assert a.instances["steps"].tolist() == [1, 1]
