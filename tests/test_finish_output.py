"""`tuner finish --no-remeasure`: an output directory inside the model's directory is refused as tune
refuses it (tuner.study.check_not_in_model), the model's directory known from the study file given or
the one the storage names; a finished study of test_export's make_study, no server."""

from __future__ import annotations

import yaml
from test_export import make_study

from tuner.cli import main


def _finished(tmp_path):
    """A finished study in tmp_path/out/study.db whose model is tmp_path/encoder_sim, the study file it
    names tmp_path/study.yaml; its storage URL."""
    study = make_study(tmp_path)
    (tmp_path / "encoder_sim").mkdir()
    (tmp_path / "encoder_sim" / "config.pbtxt").write_text(study.user_attrs["base_config_source"])
    (tmp_path / "study.yaml").write_text(yaml.safe_dump({
        "name": "exp", "model_repository": str(tmp_path), "model": "encoder_sim", "traffic": {"path": "t.csv"},
        "output": str(tmp_path / "out"), "sla": {"latency_ms": 30.0}}))
    study.set_user_attr("study_file", str(tmp_path / "study.yaml"))  # as tune records it: absolute
    return f"sqlite:///{tmp_path / 'out' / 'study.db'}"


def test_finish_refuses_an_output_in_the_models_directory_before_writing(tmp_path, capsys):
    url = _finished(tmp_path)
    model = tmp_path / "encoder_sim"
    target = model / "f"
    for argv in (["finish", "--storage", url, "--study", "exp", "--output", str(target), "--no-remeasure"],
                 ["finish", str(tmp_path / "study.yaml"), "--output", str(target), "--no-remeasure"]):
        assert main(argv) == 2, argv
        out, err = capsys.readouterr()
        assert out == "" and err == (f"tuner: error: output directory {target}: in the model's directory {model}, "
                                     "which the server loads; refusing to write there\n"), err
        assert sorted(p.name for p in model.iterdir()) == ["config.pbtxt"]
    # elsewhere the outputs are written, from the storage alone
    assert main(["finish", "--storage", url, "--output", str(tmp_path / "elsewhere"), "--no-remeasure"]) == 0
    assert (tmp_path / "elsewhere" / "summary.json").is_file()


def test_export_writes_no_new_file_in_the_models_directory_but_its_live_config_with_force(tmp_path, capsys):
    # `export -o MODEL/new.pbtxt` wrote there (and changed the model's files, so the study no longer resumed);
    # with --force it replaced the model's README or model.py
    url = _finished(tmp_path)
    model = tmp_path / "encoder_sim"
    (model / "README.md").write_text("mine\n")
    for name in ("new.pbtxt", "README.md"):
        assert main(["export", "--storage", url, "--study", "exp", "-o", str(model / name), "--force"]) == 2
        assert "in the model's directory" in capsys.readouterr().err
    assert sorted(p.name for p in model.iterdir()) == ["README.md", "config.pbtxt"]
    assert (model / "README.md").read_text() == "mine\n"
    # the live config.pbtxt is the one file there export may replace (--force: your own)
    assert main(["export", "--storage", url, "--study", "exp", "-o", str(model / "config.pbtxt"), "--force"]) == 0
