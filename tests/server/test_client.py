"""The launchers' shared pieces that need no server: read-back comparison, metrics parsing, install
checks, and the choice of launcher from a study."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tuner import modelconfig
from tuner.errors import ServerSetupError
from tuner.server import LocalLauncher, RemoteLauncher, make_launcher
from tuner.server import install as install_mod
from tuner.server.client import compare_tuned_fields, parse_prometheus
from tuner.settings import study_from_dict

BASE = modelconfig.parse("""
name: "m"
max_batch_size: 8
dynamic_batching { max_queue_delay_microseconds: 100 preferred_batch_size: [4, 8] }
instance_group [ { count: 2, kind: KIND_CPU } ]
""")


def _copy(**changes) -> modelconfig.ModelConfig:
    out = modelconfig.ModelConfig()
    out.CopyFrom(BASE)
    for key, value in changes.items():
        if key == "delay":
            out.dynamic_batching.max_queue_delay_microseconds = value
        elif key == "preferred":
            del out.dynamic_batching.preferred_batch_size[:]
            out.dynamic_batching.preferred_batch_size.extend(value)
        elif key == "count":
            out.instance_group[0].count = value
        else:
            setattr(out, key, value)
    return out


def test_same_config_has_no_mismatch():
    running = _copy()
    running.version_policy.latest.num_versions = 1  # auto-completed fields are not compared
    running.instance_group[0].name = "m_0"
    assert compare_tuned_fields(BASE, running) == []


@pytest.mark.parametrize(("changes", "field", "asked", "got"), [
    ({"max_batch_size": 4}, "max_batch_size", 8, 4),
    ({"delay": 0}, "dynamic_batching.max_queue_delay_microseconds", 100, 0),
    ({"preferred": [8]}, "dynamic_batching.preferred_batch_size", [4, 8], [8]),
    ({"count": 1}, "instance_group.count", [2], [1]),
])
def test_each_tuned_field_is_compared(changes, field, asked, got):
    assert compare_tuned_fields(BASE, _copy(**changes)) == [(field, asked, got)]


def test_missing_dynamic_batching_on_the_server_is_a_mismatch():
    running = _copy()
    running.ClearField("dynamic_batching")
    fields = [f for f, _, _ in compare_tuned_fields(BASE, running)]
    assert "dynamic_batching.max_queue_delay_microseconds" in fields


def test_unrequested_preferred_sizes_and_default_counts_are_not_mismatches():
    asked = _copy(preferred=[], count=0)
    assert compare_tuned_fields(asked, _copy(preferred=[8], count=3)) == []


def test_parse_prometheus_sums_by_name():
    text = """# HELP nv_inference_count Number of inferences
# TYPE nv_inference_count counter
nv_inference_count{model="a",version="1"} 10
nv_inference_count{model="b",version="1"} 5
nv_inference_exec_count{model="a",version="1"} 3
nv_gpu_utilization 0.5
garbage line
"""
    assert parse_prometheus(text) == {"nv_inference_count": 15.0, "nv_inference_exec_count": 3.0,
                                      "nv_gpu_utilization": 0.5}


def test_stub_python_needs_a_system_libpython(tmp_path, monkeypatch):
    for version in ("3.10", "3.11", "3.12"):
        (tmp_path / version).mkdir()
        (tmp_path / version / "triton_python_backend_stub").write_text("")
    monkeypatch.setattr(install_mod, "system_libpython",
                        lambda v: Path(f"/lib/libpython{v}.so.1.0") if v in ("3.10", "3.12") else None)
    current = f"{sys.version_info.major}.{sys.version_info.minor}"
    expected = current if current in ("3.10", "3.12") else "3.12"
    assert install_mod.choose_stub_python(tmp_path) == expected
    monkeypatch.setattr(install_mod, "system_libpython", lambda v: None)
    with pytest.raises(ServerSetupError, match="no system libpython"):
        install_mod.choose_stub_python(tmp_path)


def test_unsupported_platform_is_a_setup_error(monkeypatch):
    monkeypatch.setattr(install_mod.platform, "libc_ver", lambda: ("glibc", "2.31"))
    with pytest.raises(ServerSetupError, match=r"glibc >= 2.35, but this machine has 2.31"):
        install_mod.check_platform()
    monkeypatch.setattr(install_mod.platform, "machine", lambda: "aarch64")
    with pytest.raises(ServerSetupError, match="needs x86_64, but this machine is aarch64"):
        install_mod.check_platform()


@pytest.mark.slow
def test_pip_failure_is_a_setup_error(tmp_path, monkeypatch):
    monkeypatch.setattr(install_mod, "WHEEL", "nvidia-pytriton==0.0.0.dev999")  # no such release
    with pytest.raises(ServerSetupError, match=r"installing nvidia-pytriton==0.0.0.dev999 .* failed \(pip exit"):
        install_mod.find_tritonserver(tmp_path / "triton", quiet=True)
    # nothing half-installed: the directory holds its lock alone, and nothing is beside it
    assert [p.name for p in (tmp_path / "triton").iterdir()] == [install_mod.LOCK]
    assert [p.name for p in tmp_path.iterdir()] == ["triton"]


def test_found_install_is_complete(triton_install):
    assert triton_install.binary.is_file() and triton_install.lib_dir.is_dir()
    python = triton_install.backends_dir / "python"
    for name in ("libtriton_python.so", "triton_python_backend_utils.py", "triton_python_backend_stub"):
        assert (python / name).exists(), name
    assert (triton_install.model_pythonpath / "numpy").is_dir()
    # found again without installing
    assert install_mod.find_tritonserver(triton_install.root) == triton_install


def _study(tmp_path, **server) -> object:
    (tmp_path / "repo").mkdir(exist_ok=True)
    return study_from_dict({"name": "s", "model_repository": "repo", "model": "m",
                            "traffic": {"path": "t.csv"}, "server": server}, base_dir=tmp_path)


def test_make_launcher_chooses_by_settings(tmp_path):
    local = make_launcher(_study(tmp_path), log_dir=tmp_path / "logs")
    assert isinstance(local, LocalLauncher) and local.models == ["m"]
    assert local.log_path == tmp_path / "logs" / "tritonserver.log"
    remote = make_launcher(_study(tmp_path, launcher="remote", url="127.0.0.1:8000"))
    assert isinstance(remote, RemoteLauncher) and remote.endpoints.http == "127.0.0.1:8000"
    docker = make_launcher(_study(tmp_path, launcher="docker"))
    assert docker.name == "docker"


def test_cli_server_install_prints_where(triton_install, capsys):
    from tuner.cli import main

    assert main(["server", "install", "--dir", str(triton_install.root)]) == 0
    out = capsys.readouterr().out
    assert str(triton_install.binary) in out and "2.51.0" in out


def test_cli_server_install_into_an_unusable_dir_is_one_line(tmp_path, capsys):
    from tuner.cli import main

    blocker = tmp_path / "file"
    blocker.write_text("")
    assert main(["server", "install", "--dir", str(blocker / "triton")]) == 2
    err = capsys.readouterr().err.strip()
    # refused by the path check before any download: the directory, and why
    assert err == f"tuner: error: install directory {blocker / 'triton'}: cannot write there (Not a directory)"
    assert len(err.splitlines()) == 1


def test_tritons_reason_is_an_unknown_option_it_names_before_its_usage_text():
    from tuner.server.base import triton_reason

    usage = ["/opt/tritonserver/bin/tritonserver: unrecognized option '--bogus-flag=1'", "Usage: tritonserver [options]",
             "  --exit-on-error <boolean>", "\tExit the inference server if an error occurs during",
             "\t--load-model argument will result in error. Note that this option will only"]
    assert triton_reason(usage) == "/opt/tritonserver/bin/tritonserver: unrecognized option '--bogus-flag=1'"
    # Triton's own error line, as before: the last one, without its prefix
    assert triton_reason(["I0101 x.cc:1] starting", "E0101 y.cc:2] Poll failed for model directory 'm'",
                          "error: creating server: Internal - failed to load all models"]) == \
        "Poll failed for model directory 'm'"
    # a CPU-only host's start-up line is not a reason, not even when nothing else says error (a killed server)
    cuda = "E1207 08:41:23.503 4711 cuda_memory_manager.cc:101] CudaDriverHelper has not been initialized."
    assert triton_reason(["I1207 x.cc:1] starting", cuda, "I1207 y.cc:2] Started HTTPService"]) == ""
    assert triton_reason([cuda, "E1207 y.cc:2] Poll failed for model directory 'm'"]) == "Poll failed for model directory 'm'"
