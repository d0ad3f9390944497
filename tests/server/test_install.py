"""`tuner server install --dir`: a directory of the person's own is refused, never filled in place; the
lock and the staging are inside the directory, and no staging outlives a run (pip is faked here)."""

from __future__ import annotations

import fcntl
import subprocess
from pathlib import Path

import pytest

from tuner.cli import main
from tuner.errors import ServerSetupError
from tuner.server import install as install_mod


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


def _fake_pip(monkeypatch, *, then=None, during=None):
    """pip replaced: it fills its --target as the wheel would (part of it, when `then` is raised
    midway: Ctrl-C, an error), calling `during(target)` first."""
    calls = []

    def run(cmd, **kwargs):
        target = Path(cmd[cmd.index("--target") + 1])
        calls.append(target)
        if during is not None:
            during(target)
        (target / "nvidia_pytriton-0.7.0.dist-info").mkdir(parents=True)
        (target / "nvidia_pytriton.libs").mkdir()
        if then is not None:
            raise then
        (target / "pytriton" / "tritonserver" / "bin").mkdir(parents=True)
        (target / "pytriton" / "tritonserver" / "bin" / "tritonserver").write_text("")
        return subprocess.CompletedProcess(cmd, 0, stdout="")

    monkeypatch.setattr(install_mod.subprocess, "run", run)
    return calls


def _tree(folder):
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


@pytest.mark.parametrize("stop", [KeyboardInterrupt(), ServerSetupError("pip failed")])
def test_a_stopped_install_leaves_no_staging_and_nothing_beside_the_directory(tmp_path, monkeypatch, stop):
    # Ctrl-C left D/../.triton.XXXX/ (or D/.model-python3.11.XXXX/) for good, one per interrupt, and the
    # lock file .triton.lock beside D, in a directory the person did not name
    root = tmp_path / "triton"
    _fake_pip(monkeypatch, then=stop)
    with pytest.raises(type(stop)):
        install_mod._install(root, quiet=True)
    assert _tree(tmp_path) == ["triton", f"triton/{install_mod.LOCK}"]
    (root / "pytriton" / "tritonserver" / "bin").mkdir(parents=True)
    (root / "nvidia_pytriton-0.7.0.dist-info").mkdir()
    before = _tree(tmp_path)
    done = install_mod.TritonInstall(root=root, binary=root / "b", lib_dir=root, backends_dir=root,
                                     python_version="3.11", model_pythonpath=root / "model-python3.11")
    with pytest.raises(type(stop)):
        install_mod._install_model_numpy(done, quiet=True)
    assert _tree(tmp_path) == before


def test_an_install_sweeps_the_staging_a_killed_run_left_and_nothing_else(tmp_path, monkeypatch):
    root = tmp_path / "triton"
    for stale in (root / ".tuner-staging-k1ll3d00", root / ".model-python3.11.ab_cd123", root / ".wheel",
                  tmp_path / ".triton.x8y7z6w5"):  # the last two: where earlier versions staged
        (stale / "pytriton").mkdir(parents=True)
        (stale / "pytriton" / "part.py").write_text("")
    (tmp_path / ".triton.lock").write_text("")  # an earlier version's lock, beside the directory
    (tmp_path / ".triton.notes").write_text("mine\n")  # not a staging name: the person's own
    (tmp_path / ".triton.longer-name").mkdir()
    calls = _fake_pip(monkeypatch)
    install_mod._install(root, quiet=True)
    assert len(calls) == 1 and calls[0].parent == root and calls[0].name.startswith(install_mod.STAGING)
    assert sorted(p.name for p in root.iterdir()) == [install_mod.LOCK, "nvidia_pytriton-0.7.0.dist-info",
                                                      "nvidia_pytriton.libs", "pytriton"]
    assert install_mod._binary(root).is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == [".triton.longer-name", ".triton.notes", "triton"]


def test_the_install_holds_its_lock_inside_the_directory_while_pip_runs(tmp_path, monkeypatch):
    # two installs into one directory take turns on the lock file in it, made before anything else
    root = tmp_path / "deep" / "triton"
    held = []

    def try_lock(target):
        assert sorted(p.name for p in root.iterdir()) == [install_mod.LOCK, target.name]
        with open(root / install_mod.LOCK) as other:  # a second open file: as another process would
            try:
                fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                held.append(True)

    _fake_pip(monkeypatch, during=try_lock)
    install_mod._install(root, quiet=True)
    assert held == [True]
    assert sorted(p.name for p in (tmp_path / "deep").iterdir()) == ["triton"]


# pip's log (--log) of a full disk and of a release that does not exist, shortened (its paths made
# relative: the text is parsed, no file is read)
_FULL_DISK = """\
2026-12-06T19:48:43,100 Successfully installed nvidia-pytriton-0.7.0
2026-12-06T19:48:43,401 ERROR: Exception:
2026-12-06T19:48:43,401 Traceback (most recent call last):
2026-12-06T19:48:43,401 OSError: [Errno 18] Invalid cross-device link: 'staging/pip-target-lo0/lib/python/pytriton' -> 'target/pytriton'
2026-12-06T19:48:43,401 During handling of the above exception, another exception occurred:
2026-12-06T19:48:43,401   File "shutil.py", line 515, in _copytree
2026-12-06T19:48:43,401     raise Error(errors)
2026-12-06T19:48:43,401 shutil.Error: [('staging/tritonserver', 'target/tritonserver', "[Errno 28] No space left on device: 'staging/tritonserver' -> 'target/tritonserver'"), ('staging/x.py', 'target/x.py', "[Errno 28] No space left on device: 'staging/x.py' -> 'target/x.py'")]
2026-12-06T19:48:43,403 Removed build tracker: 'pip-build-tracker-ics0_xyr'
"""
_NOT_FOUND = """\
2026-12-06T19:48:44,051 ERROR: Could not find a version that satisfies the requirement nvidia-pytriton==0.0.0.dev999 (from versions: 0.6.0, 0.7.0)
2026-12-06T19:48:44,051 ERROR: No matching distribution found for nvidia-pytriton==0.0.0.dev999
2026-12-06T19:48:44,052 Traceback (most recent call last):
2026-12-06T19:48:44,052 pip._internal.exceptions.DistributionNotFound: No matching distribution found for nvidia-pytriton==0.0.0.dev999
2026-12-06T19:48:44,054 Removed build tracker: 'pip-build-tracker-m5ujerhm'
"""


def test_pips_reason_is_its_last_error_line():
    assert install_mod._pip_reason(_FULL_DISK) == "[Errno 28] No space left on device"
    assert install_mod._pip_reason(_NOT_FOUND) == "No matching distribution found for nvidia-pytriton==0.0.0.dev999"
    crash = "2026-12-06T19:48:44,051 ERROR: Exception:\n2026-12-06T19:48:44,051 Traceback (most recent call last):\n" \
            "2026-12-06T19:48:44,052 ValueError: boom\n"
    assert install_mod._pip_reason(crash) == "ValueError: boom"
    assert install_mod._pip_reason("") == ""


@pytest.mark.parametrize("quiet", [False, True])
def test_a_failed_pip_is_one_line_that_carries_pips_reason(tmp_path, monkeypatch, capsys, quiet):
    # a full disk said "see pip's output above", the reason buried in 38 lines of pip's output
    logs = []

    def run(cmd, stdout=None, **kwargs):
        shown = "\n".join(line.split(" ", 1)[1] for line in _FULL_DISK.splitlines())
        if "--log" in cmd:
            logs.append(Path(cmd[cmd.index("--log") + 1]))
            with open(logs[-1], "a") as fh:
                fh.write(_FULL_DISK)
        if hasattr(stdout, "write"):  # shown, as pip shows it
            print(shown, file=stdout)
        return subprocess.CompletedProcess(cmd, 2, stdout=shown if stdout is subprocess.PIPE else None)

    monkeypatch.setattr(install_mod.subprocess, "run", run)
    root = tmp_path / "triton"
    with pytest.raises(ServerSetupError) as caught:
        install_mod._install(root, quiet=quiet)
    assert str(caught.value) == (f"installing nvidia-pytriton==0.7.0 into {root} failed (pip exit 2): "
                                 "[Errno 28] No space left on device")
    if not quiet:
        capsys.readouterr()
        assert main(["server", "install", "--dir", str(root)]) == 2
        assert capsys.readouterr().err.splitlines()[-1] == (
            f"tuner: error: installing nvidia-pytriton==0.7.0 into {root} failed (pip exit 2): "
            "[Errno 28] No space left on device")
    assert not list(tmp_path.glob("**/.tuner-staging-*")) and logs and not any(log.exists() for log in logs)
