"""`tuner profile`'s refusals, made before any server starts (no server here: the launcher is replaced by
one that says it was reached): the model's config as `tuner tune --check` checks it, the settings the
simulation refuses, and where the profile may be written."""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

import pytest
import yaml

from tuner.cli import main
from tuner.errors import ServerSetupError
from tuner.simulate import FORMAT_LINE

TEMPLATE = Path(__file__).resolve().parents[1] / "model_repository_templates" / "encoder_sim"
REACHED = "the launcher was reached"


@pytest.fixture
def study(tmp_path, monkeypatch) -> Path:
    """A study of a copy of encoder_sim; starting its server raises REACHED instead."""
    import tuner.server

    def launcher(settings):
        raise ServerSetupError(REACHED)

    monkeypatch.setattr(tuner.server, "make_launcher", launcher)
    shutil.copytree(TEMPLATE, tmp_path / "repo" / "encoder_sim")
    (tmp_path / "traffic.csv").write_text("timestamp,batch_size,seq_len\n" + "".join(
        f"{i / 10},1,{20 + i}\n" for i in range(50)))
    (tmp_path / "study.yaml").write_text(yaml.safe_dump({
        "name": "profile", "model_repository": str(tmp_path / "repo"), "model": "encoder_sim",
        "traffic": {"path": str(tmp_path / "traffic.csv")}, "sla": {"latency_ms": 100, "percentile": 99},
        "cost": {"gpu": "a100-40gb"}, "search": {"max_batch_size": {"low": 1, "high": 8, "log": True}},
        "output": str(tmp_path / "out"),
    }))
    return tmp_path


def _error(capsys, code: int) -> str:
    out, err = capsys.readouterr()
    assert code == 2 and out == "", out + err
    assert err.startswith("tuner: error: ") and len(err.strip().splitlines()) == 1, err
    return err.strip()


def _reached(capsys, code: int) -> bool:
    """Whether the command went past its checks to start the server."""
    return code == 2 and capsys.readouterr().err.strip().endswith(f"tuner: error: {REACHED}")


@pytest.mark.parametrize("target", ["traffic.csv", "repo/encoder_sim/config.pbtxt", "repo/encoder_sim/1/model.py",
                                    "repo/encoder_sim/p.csv", "repo/encoder_sim/1/p.csv"])
@pytest.mark.parametrize("force", [False, True])
def test_the_profile_is_never_written_over_the_studys_traffic_or_into_its_model(study, capsys, target, force):
    # a new file in the model's directory too: the server loads it, a resumed study digests it
    before = (study / target).read_bytes() if (study / target).exists() else None
    code = main(["profile", str(study / "study.yaml"), "-o", str(study / target), *(["--force"] if force else [])])
    err = _error(capsys, code)
    assert f"{study / target}: " in err and "refusing to write" in err
    assert ((study / target).read_bytes() if (study / target).exists() else None) == before


@pytest.mark.parametrize("traffic", ["traffic", "traffic/*.csv"])
def test_a_new_profile_is_never_written_where_the_studys_traffic_would_read_it(study, capsys, traffic):
    # the study's traffic is a directory (or a glob): a profile.csv made there is traffic the next run replays
    (study / "traffic").mkdir()
    shutil.move(study / "traffic.csv", study / "traffic" / "day1.csv")
    settings = yaml.safe_load((study / "study.yaml").read_text())
    settings["traffic"]["path"] = str(study / traffic)
    (study / "study.yaml").write_text(yaml.safe_dump(settings))
    for force in ([], ["--force"]):
        err = _error(capsys, main(["profile", str(study / "study.yaml"), "-o", str(study / "traffic" / "p.csv"), *force]))
        assert f"profile {study / 'traffic' / 'p.csv'}: among the study's traffic files" in err, err
        assert not (study / "traffic" / "p.csv").exists()
    assert _reached(capsys, main(["profile", str(study / "study.yaml"), "-o", str(study / "p.csv")]))  # beside it


def test_traffic_tune_refuses_is_refused_before_any_server(study, capsys):
    # encoder_sim's max_batch_size is 64: a request of 65 rows is one Triton refuses on every trial
    (study / "traffic.csv").write_text("timestamp,batch_size,seq_len\n" + "".join(
        f"{i / 10},{65 if i == 7 else 1},{20 + i}\n" for i in range(50)))
    err = _error(capsys, main(["profile", str(study / "study.yaml"), "-o", str(study / "p.csv")]))
    assert "max_batch_size is 64, but the traffic has requests of 65 rows (traffic row 8, timestamp 0.7)" in err and REACHED not in err


def test_a_file_tuner_did_not_write_is_replaced_only_with_force(study, capsys):
    mine = study / "mine.csv"
    mine.write_text("rows,length,median_ms\n1,10,1.0\n")  # a profile-like table, but not a profile tuner wrote
    argv = ["profile", str(study / "study.yaml"), "-o", str(mine)]
    err = _error(capsys, main(argv))
    assert f"profile {mine}: exists and tuner did not write it" in err and "--force" in err
    assert _reached(capsys, main([*argv, "--force"]))  # past the check: on to the server
    mine.write_text(f"{FORMAT_LINE}\n# an earlier profile\n")
    assert _reached(capsys, main(argv))
    (study / "out").mkdir()
    (study / "out" / "profile.csv").write_text("my own\n")  # the default place too
    assert "exists and tuner did not write it" in _error(capsys, main(argv[:2]))
    assert mine.read_text() == f"{FORMAT_LINE}\n# an earlier profile\n"
    assert (study / "out" / "profile.csv").read_text() == "my own\n"


@pytest.mark.parametrize("broken,says", [
    ("priority", "the batcher simulation does not model dynamic_batching.priority_levels"),
    ("preferred", "dynamic batching preferred size must be <= max batch size"),
    ("name", "name 'other' is not its directory's ('encoder_sim')"),
    ("version", "no version directory"),
])
def test_a_config_tune_check_or_the_simulation_refuses_is_refused_before_any_server(study, capsys, broken, says):
    config = study / "repo" / "encoder_sim" / "config.pbtxt"
    text = config.read_text()
    if broken == "priority":
        config.write_text(text.replace("dynamic_batching { }",
                                       "dynamic_batching { priority_levels: 2 default_priority_level: 1 }"))
    elif broken == "preferred":
        config.write_text(text.replace("dynamic_batching { }", "dynamic_batching { preferred_batch_size: [128] }"))
    elif broken == "name":
        config.write_text(text.replace('name: "encoder_sim"', 'name: "other"'))
    else:
        shutil.rmtree(config.parent / "1")
    err = _error(capsys, main(["profile", str(study / "study.yaml"), "-o", str(study / "p.csv")]))
    assert says in err and REACHED not in err
    if broken == "priority":  # the line simulate gives, naming both commands
        assert "tuner simulate and tuner profile refuse this config" in err
        (study / "p.csv").write_text(f"{FORMAT_LINE}\n")
        code = main(["simulate", str(study / "study.yaml"), "--profile", str(study / "p.csv")])
        assert _error(capsys, code) == err
    else:
        assert not (study / "p.csv").exists()


def test_a_profile_in_a_missing_directory_is_refused_as_every_json_is(study, capsys):
    """One rule for a file a person names (tuner.files.check_writable): its directory must exist; none is
    made (`replay --json` says the same). The study's own output directory is made, as tune makes it."""
    target = study / "typo" / "deep" / "p.csv"
    err = _error(capsys, main(["profile", str(study / "study.yaml"), "-o", str(target)]))
    assert err == f"tuner: error: profile {target}: cannot write: no directory {target.parent}", err
    assert not (study / "typo").exists()
    json_err = _error(capsys, main(["replay", str(study / "study.yaml"), "--json", str(target)]))
    assert json_err.endswith(f"cannot write: no directory {target.parent}") and not (study / "typo").exists()
    assert _reached(capsys, main(["profile", str(study / "study.yaml")]))  # the default: out/profile.csv
    assert (study / "out").is_dir()


BUDGET = 200  # the fake device's padded tokens: at the traffic's longest lengths, 4 rows run out of memory


@pytest.fixture
def measured(study, monkeypatch) -> Path:
    """`study`, on a fake server whose every request takes rows x length / 100 ms and runs out of memory
    past BUDGET padded tokens (the profiler's own logic measures it, bars and table included)."""
    import tuner.profiler as profiler
    import tuner.server
    from tuner.profiler import Sample

    class Sender:
        resent = untimed = 0  # every execution counted in time

        def __init__(self, *args, **kwargs):
            pass

        def send(self, rows, length, *, measured=True):
            fits = rows * length <= BUDGET
            return Sample(rows=rows, length=length, ok=fits, client_ms=1.0, input_ms=0.05,
                          infer_ms=rows * length / 100, output_ms=0.1, measured=measured,
                          error="" if fits else "CUDA out of memory (emulated)")

        def send_held(self, n, length, *, blocker, measured=True):
            return Sample(rows=n, length=length, ok=True, client_ms=1.0, infer_ms=0.5 + 0.1 * n, measured=measured,
                          requests=n)

    class Launcher:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def apply_config(self, model, config):
            return config

    monkeypatch.setattr(tuner.server, "make_launcher", lambda settings: Launcher())
    monkeypatch.setattr(profiler, "_Sender", Sender)
    monkeypatch.setattr(profiler, "padded_lengths", lambda *a, **k: ())  # the traffic's lengths only
    settings = yaml.safe_load((study / "study.yaml").read_text())
    (study / "study.yaml").write_text(yaml.safe_dump({**settings, "measurement": {"warmup": False}}))
    return study


def test_quiet_draws_no_progress_bar_and_still_prints_the_profile(measured, capsys):
    argv = ["profile", str(measured / "study.yaml"), "-o", str(measured / "p.csv"), "--repeats", "2",
            "--concurrent-executions", "1"]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert "\r" in err and "profile:" in err and "point/s]" in err  # the bar, drawn to a stderr that is no terminal
    assert main([*argv, "--quiet"]) == 0
    quiet_out, quiet_err = capsys.readouterr()
    assert "\r" not in quiet_err and "point/s" not in quiet_err and "%|" not in quiet_err, quiet_err
    assert quiet_out.splitlines()[:-1] == out.splitlines()[:-1]  # the table and notes; the last line: the seconds
    assert quiet_out.splitlines()[-1].startswith(f"wrote {measured / 'p.csv'}: ")
    assert quiet_err.startswith("profile: encoder_sim on the local server")  # its one-line notes


def test_the_table_says_what_a_blank_beyond_a_lengths_memory_limit_means(measured, capsys, monkeypatch):
    """At length 57, 4 rows run out of memory and 8 are never sent (they would too): its cell is blank, as
    are rows another length's bisection tried (3 at length 21); the legend says so, not OOM alone."""
    argv = ["profile", str(measured / "study.yaml"), "-o", str(measured / "p.csv"), "--repeats", "2",
            "--concurrent-executions", "1", "--quiet"]
    assert main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    legend = lines[0]
    assert legend.startswith("device time per execution (Triton's compute_infer), ms: median (p10-p90) of 2 "
                             "requests; OOM: out of memory; blank: not measured at that length (more rows than "
                             "an OOM there, which run out of memory too, or rows tried only where another "
                             "length's memory limit was searched)"), legend
    cells = _table(lines)
    assert cells[4]["len 57"] == "OOM" and cells[8]["len 57"] == "" and cells[8]["len 69"] == ""
    assert cells[3]["len 21"] == "" and cells[3]["len 69"] == "OOM"
    monkeypatch.setattr(sys.modules[__name__], "BUDGET", 10_000)  # no length runs out of memory: no blank
    assert main(argv) == 0
    legend = capsys.readouterr().out.splitlines()[0]
    assert legend.endswith("of 2 requests; OOM: out of memory"), legend


def _table(lines: list[str]) -> dict[int, dict[str, str]]:
    """The printed device-time table: each row's cells by column (right-aligned under their heading)."""
    first = next(k for k, x in enumerate(lines) if x.lstrip().startswith("rows "))
    head = lines[first]
    ends = [m.end() for m in re.finditer(r"rows|len \d+", head)]
    spans = list(zip([0, *ends[:-1]], ends, strict=True))
    table = {}
    for line in lines[first + 1:]:
        if not line[:ends[0]].strip().isdigit():
            break
        cells = {head[a:b].strip(): line.ljust(len(head))[a:b].strip() for a, b in spans}
        table[int(cells.pop("rows"))] = cells
    return table
