"""The production audit's findings table (tuner/production/_result.py) and what `tuner audit
--prometheus` prints and writes (tuner/cli/audit_cmd.py), from hand-made counters: no Prometheus, the
answers worked out here."""

from __future__ import annotations

import json

import pandas as pd
import yaml

from benchmarks.production_audit import write_study
from tuner import production
from tuner.cli import main
from tuner.production._audit import judge
from tuner.production._figures import COLUMNS, SECONDS
from tuner.production._series import Counters
from tuner.soak import soak_dir
from tuner.soak._files import FINDINGS, META, write_json

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


def test_the_production_audit_prints_the_last_soak_as_the_replay_audit_does(tmp_path, monkeypatch, capsys):
    study = write_study(tmp_path)
    settings = yaml.safe_load(study.read_text())
    study.write_text(yaml.safe_dump({**settings, "output": str(tmp_path / "out")}))
    folder = soak_dir(tmp_path / "out")
    folder.mkdir(parents=True)
    write_json(folder / META, {"started_utc": "2026-01-02T03:04:05Z", "plan": {"hours": 12, "speed": 72}})
    write_json(folder / FINDINGS, {"verdict": "drift", "windows_analysed": 20,
                                   "trends": [{"figure": "compute_ms_per_request", "verdict": "drift",
                                               "relative_per_hour": 0.03}],
                                   "restart": {"reason": "restart every 9 hours"}})
    monkeypatch.setattr(production, "production_audit",
                        lambda *a, **k: audit(one_hour([("127.0.0.1:8002", 36000, 3600.0)])))
    code = main(["audit", str(study), "--prometheus", "http://127.0.0.1:1", "--window", "1h",
                 "--json", str(tmp_path / "a.json")])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "last soak (2026-01-02T03:04, 12 h of recorded traffic at speed 72, 20 windows): drift" in out, out
    assert "restart every 9 hours" in out
    found = json.loads((tmp_path / "a.json").read_text())["findings"]
    assert [f["check"] for f in found][-2:] == ["last soak", ""] and found[-2]["verdict"] == "watch"
