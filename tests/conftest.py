"""Session-wide fixtures: the Triton install, the template models, and one shared local server.

`local_server` serves both templates (encoder_sim, matmul_cpu) for the whole session. A test that
changes a model's configuration on it must put the template's configuration back (see
`restore_template_config`), or start its own LocalLauncher.
"""

from __future__ import annotations

import contextlib
import fcntl
import signal
import sys
from pathlib import Path

import pytest

from tuner import modelconfig
from tuner.server.install import TritonInstall, find_tritonserver
from tuner.server.local import LocalLauncher

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # the benchmarks' helpers, as `benchmarks.encoder_sim` (after the installed tuner)
    sys.path.append(str(ROOT))
TEMPLATES_DIR = ROOT / "model_repository_templates"
TEMPLATE_MODELS = ("encoder_sim", "matmul_cpu")

# A runner that starts the suite in the background (`cmd &` in a non-interactive shell) leaves SIGINT
# ignored, and every child inherits that: the Ctrl-C tests would send a signal no child can receive.
# A handler (unlike SIG_IGN) is reset to the default in a child at exec, so children get Ctrl-C again.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="session")
def triton_install() -> TritonInstall:
    """The tritonserver from the nvidia-pytriton wheel (installed into the user cache on first use)."""
    return find_tritonserver()


@pytest.fixture(scope="session")
def templates_dir() -> Path:
    return TEMPLATES_DIR


@pytest.fixture(scope="session")
def local_server(triton_install, templates_dir):
    """A running LocalLauncher with both template models loaded; stopped at the end of the session."""
    launcher = LocalLauncher(templates_dir, models=list(TEMPLATE_MODELS), install=triton_install)
    with launcher:
        yield launcher


def template_config(templates_dir: Path, model: str) -> modelconfig.ModelConfig:
    return modelconfig.load(templates_dir / model / "config.pbtxt")


@pytest.fixture
def restore_template_config(local_server, templates_dir):
    """Use in a test that changes `local_server`: reloads the templates' own configurations afterwards."""
    yield
    for model in TEMPLATE_MODELS:
        local_server.apply_config(model, template_config(templates_dir, model))


@pytest.fixture(scope="session")
def postgres():
    """A private PostgreSQL cluster on 127.0.0.1 for the session (tests/pg_cluster.py); skips saying
    why without the binaries or the driver, fails instead in CI (TUNER_REQUIRE_ALL=1)."""
    from pg_cluster import missing, private_cluster, unavailable

    reason = missing()
    if reason:
        unavailable(reason)
    with private_cluster() as cluster:
        yield cluster


# The slowest files first (each minutes of real tuning): scripts/run-tests.sh runs the suite on four
# workers, a file per worker, in this order (`--no-loadscope-reorder`), so the long files start at once.
# The two files of multi-process studies (test_tune_e2e, test_postgres) take turns on a lock: the
# second starts only when a worker is done with the third file, by when the first has let it go.
SLOWEST_FIRST = ("test_tune_e2e.py", "test_nightly_server.py", "test_report.py", "test_postgres.py",
                 "test_model_search.py", "test_examples.py", "test_docker.py", "test_soak_cmd.py",
                 "test_warmup.py", "test_audit.py", "test_profiler.py", "test_replay_cli.py")
# The tests that start vLLM's CPU engine (a few GB, both cores while it loads and steps): one worker runs
# them all, one after another and first (the longest unit of work), so that two engines never share the
# two cores and no worker idles on the engine lock (`EngineGroupScheduling`).
ENGINE_GROUP = "vllm-engine"
ENGINE_PATHS = ("tests/llm/", "tests/production/test_engine_audit.py")
# The tests that take `no_vllm_engine_beside` join the group: the engine's worker runs them in turn, when
# no engine runs, where another worker holding the engine lock had the engine's worker idle on it (CI:
# 150 s). By node id: xdist's scheduler sees no fixtures (`pytest_collection_modifyitems` checks the list).
ENGINE_BESIDE = ("tests/test_tune_e2e.py::test_tune_recommends_a_config_that_loads_beats_the_incumbent_and_holds_its_capacity",)


def engine_scope(nodeid: str) -> str | None:
    """ENGINE_GROUP for a test that starts vLLM's engine (by its file) or must not run beside it, else None."""
    return ENGINE_GROUP if nodeid.startswith(ENGINE_PATHS) or nodeid.split("[")[0] in ENGINE_BESIDE else None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The engine's group first (`engine_scope`), then the slowest files; in a file, the tests that take
    `one_multi_process_study_at_a_time` first: they are done within minutes of the start, before the
    other worker reaches the other file of such tests (its worker would otherwise idle for minutes on
    the lock)."""
    stray = [item.nodeid for item in items if "no_vllm_engine_beside" in getattr(item, "fixturenames", ())
             and engine_scope(item.nodeid) is None]
    if stray:
        raise pytest.UsageError(f"tests/conftest.py: add to ENGINE_BESIDE the tests that take no_vllm_engine_beside: "
                                f"{', '.join(stray)}")
    rank = {name: k for k, name in enumerate(SLOWEST_FIRST)}

    def key(item: pytest.Item) -> tuple[bool, int, bool]:
        fixtures = getattr(item, "fixturenames", ())
        return (engine_scope(item.nodeid) is None, rank.get(item.path.name, len(rank)),
                "one_multi_process_study_at_a_time" not in fixtures)

    items.sort(key=key)  # stable: the rest keep their order


try:
    from xdist.scheduler import LoadFileScheduling
except ImportError:  # without pytest-xdist the suite runs in one process: nothing to group
    LoadFileScheduling = None

if LoadFileScheduling is not None:
    class EngineGroupScheduling(LoadFileScheduling):
        """`--dist loadfile`, but every engine test is one unit of work (one worker runs them in turn).
        xdist's public hook `pytest_xdist_make_scheduler` takes a scheduler; how LoadFileScheduling
        groups tests (`_split_scope`) is not public API: the one override lives here."""

        def _split_scope(self, nodeid: str) -> str:
            return engine_scope(nodeid) or super()._split_scope(nodeid)

    def pytest_xdist_make_scheduler(config, log):
        return EngineGroupScheduling(config, log) if config.getoption("dist") == "loadfile" else None


@contextlib.contextmanager
def take_turns(tmp_path_factory, name: str):
    """Hold the lock file `name`, shared by the session's pytest workers, while in use."""
    root = tmp_path_factory.getbasetemp()
    root = root.parent if root.name.startswith("popen-gw") else root  # the workers' common directory
    with open(root / name, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


@pytest.fixture
def one_multi_process_study_at_a_time(tmp_path_factory):
    """For a test that runs several `tuner tune` processes, each with its own server, and times their
    kills and heartbeats: two such tests side by side (one per pytest worker) overload two cores and
    miss their timing, so they take turns (a lock file shared by the session's workers)."""
    with take_turns(tmp_path_factory, "multi-process-study.lock"):
        yield


@pytest.fixture
def one_vllm_engine_at_a_time(tmp_path_factory):
    """For a test that starts vLLM's CPU engine (a few GB, both cores while it loads and steps): two
    engines side by side starve each other and every timed test of the third worker, so the tests that
    start one take turns (tests/llm/conftest.py holds it for each of its files). Under xdist the engine
    tests are one unit on one worker (`EngineGroupScheduling`) and the lock is never contended; it holds
    for any other way of spreading them."""
    with take_turns(tmp_path_factory, "vllm-engine.lock"):
        yield


@pytest.fixture
def no_vllm_engine_beside(tmp_path_factory):
    """For a test whose claim is a timing measured twice, minutes apart (a capacity found by `tune`,
    then held by fresh replays): the engine takes both cores in bursts, so one measurement beside it
    and the other not disagree by more than the claim's margin (CI: p99 118 ms at 0.9x a capacity
    found at p99 <= 100 ms). Under xdist it runs in the engine's group (`ENGINE_BESIDE`), where the lock
    is never contended; it holds the engine lock for any other way of spreading the tests."""
    with take_turns(tmp_path_factory, "vllm-engine.lock"):
        yield


@pytest.fixture(scope="module")
def one_vllm_engine_file_at_a_time(tmp_path_factory):
    """The same turn, held for a whole file (its module-scoped servers included): tests/llm/conftest.py."""
    with take_turns(tmp_path_factory, "vllm-engine.lock"):
        yield


@pytest.fixture(autouse=True, scope="session")
def traffic_cache(tmp_path_factory):
    """CSV recordings are converted to Parquet in the tuner's cache: the tests' own, not the user's
    (the variable reaches the servers and CLI processes the tests start, too)."""
    import os

    cache = tmp_path_factory.mktemp("traffic-cache")
    before = os.environ.get("TUNER_TRAFFIC_CACHE")
    os.environ["TUNER_TRAFFIC_CACHE"] = str(cache)
    yield cache
    if before is None:
        os.environ.pop("TUNER_TRAFFIC_CACHE", None)
    else:
        os.environ["TUNER_TRAFFIC_CACHE"] = before
