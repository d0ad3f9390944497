"""`tuner server install --dir`: a directory of the person's own is refused, never filled in place."""

from __future__ import annotations

import pytest

from tuner.cli import main
from tuner.errors import ServerSetupError


def _own_files(root):
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "tool").write_text("mine\n")
    (root / "pytriton").mkdir()
    (root / "pytriton" / "mine.py").write_text("mine\n")
    (root / "notes.txt").write_text("mine\n")
    return {p.relative_to(root): p.read_text() for p in root.rglob("*") if p.is_file()}


def test_a_directory_of_ones_own_files_is_refused_in_one_line_and_left_as_it_was(tmp_path, capsys):
    # the wheel's top-level entries are bin/ and pytriton/: filling this directory in place replaced them
    root = tmp_path / "mine"
    before = _own_files(root)
    assert main(["server", "install", "--dir", str(root)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "not empty (bin, notes.txt, pytriton)" in err and "nothing was changed" in err
    assert {p.relative_to(root): p.read_text() for p in root.rglob("*") if p.is_file()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine"]  # no lock file beside it either


def test_an_earlier_install_of_the_wheel_is_not_taken_for_ones_own_files(tmp_path):
    # a broken earlier install (its dist-info, no binary) is filled in again; an empty directory too
    from tuner.server.install import _check_ours  # the check alone: the install itself needs pip's index

    earlier = tmp_path / "triton"
    (earlier / "nvidia_pytriton-0.7.0.dist-info").mkdir(parents=True)
    (earlier / "pytriton").mkdir()
    _check_ours(earlier)
    (tmp_path / "empty").mkdir()
    _check_ours(tmp_path / "empty")
    _check_ours(tmp_path / "new")
    (tmp_path / "empty" / "x").write_text("")
    with pytest.raises(ServerSetupError, match="not a Triton install"):
        _check_ours(tmp_path / "empty")


def test_the_default_install_directory_follows_xdg_cache_home_as_every_cache_does(tmp_path, monkeypatch):
    # DEFAULT_DIR hard-coded ~/.cache/tuner/triton while the traffic and LLM caches followed XDG_CACHE_HOME
    from tuner.server.install import install_dir_for

    monkeypatch.delenv("TUNER_TRITON_HOME", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert install_dir_for() == tmp_path / "xdg" / "tuner" / "triton" / "nvidia-pytriton-0.7.0"
    assert not (tmp_path / "xdg").exists()  # where it is, only: a read-only install is used as it is
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert install_dir_for() == tmp_path / "home" / ".cache" / "tuner" / "triton" / "nvidia-pytriton-0.7.0"
    monkeypatch.setenv("TUNER_TRITON_HOME", str(tmp_path / "mine"))
    assert install_dir_for() == tmp_path / "mine"
    assert install_dir_for(tmp_path / "given") == tmp_path / "given"
