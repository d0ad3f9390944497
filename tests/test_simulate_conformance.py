"""The batcher simulation against a real tritonserver: the same scripted arrivals sent to Triton and to
`tuner.simulate.simulate`, Triton's executions per batch size (`batch_stats`) and its errors compared
with the simulator's batches and refusals, exactly.

Timing is made not to decide: arrivals are 20 ms apart (at least), an execution takes 200 ms (`SLOW_S`,
a sleep), and every queue delay and queue timeout ends at least 30 ms away from any arrival or
execution end, so that which requests batch together depends on the batcher's rules, not on the
scheduling of a shared machine (a thread wakes within a few ms). Each run checks that premise: a
request sent more than `LATE_MS` after its due time, an execution longer than `SLOW_S` by more
than `LATE_MS` (a CI machine under load once woke a thread 60 ms late), or responses straying from
the simulation's by more than `LATE_MS` (a stall neither shows), voids the run, which is repeated
(up to `ATTEMPTS` runs); a run whose timing held must match exactly. Stretching every time instead
would not do: Triton's batcher has fixed 500 ms waits of its own. One race is Triton's own: when an
execution ends, its instance thread and the batcher race (`simulate`'s `instance_first`; with both
cores busy the batcher won most), and each end runs it again (a loaded CI machine gave the instance
one end and the batcher the next, in four runs of four), so a run must match one of the outcomes of
some sequence of winners, the one whose timing it kept (no response's offset from it jumping by more
than `LATE_MS`: `drift_ms`). The cases: bursts and gaps, requests
of several rows, mixed lengths with and without ragged batching, delay 0 and > 0 (a batch queued
behind a busy instance grows, or does not when the batcher is not woken), preferred sizes none and
powers of two (the preferred-size close at delay 0), 1 and 2 instances, `max_queue_size`, and a queue
timeout with each action, and queued batches merging. Each model is its own, so the cases share one
server.
"""

from __future__ import annotations

import itertools
import json
import shutil
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from tuner import modelconfig
from tuner.server.local import LocalLauncher
from tuner.simulate import OK, BatcherConfig, Profile, Requests, equal_shapes_of, simulate

ECHO = Path(__file__).resolve().parent / "data" / "replay_models" / "echo"
SLOW_S = 0.200  # one execution, the time arrivals have to queue behind a busy instance
LATE_MS, ATTEMPTS = 15.0, 4  # half the cases' smallest margin; runs until one keeps its timing
SPACING_S, DELAY_US, MAX_BATCH = 0.010, 300_000, 8  # the fast echo model's equal-vs-ragged case
LENGTHS = [4, 4, 4, 8, 8, 4, 4]  # a length change closes the forming batch when shapes must be equal

pytestmark = pytest.mark.slow


@dataclass(frozen=True, kw_only=True)
class Case:
    """One model configuration and the arrivals scripted against it (ms, rows, lengths)."""

    name: str
    at_ms: tuple[int, ...]
    rows: tuple[int, ...] = ()
    lengths: tuple[int, ...] = ()
    max_batch_size: int = 8
    delay_us: int = 0
    preferred: tuple[int, ...] = ()
    instances: int = 1
    max_queue_size: int = 0
    timeout_us: int = 0
    action: str = "REJECT"
    ragged: bool = True

    def requests(self) -> Requests:
        n = len(self.at_ms)
        return Requests(due_s=np.asarray(self.at_ms, dtype=float) / 1e3,
                        rows=np.asarray(self.rows or [1] * n, dtype=np.int64),
                        length=np.asarray(self.lengths or [4] * n, dtype=np.int64))


BURST = tuple(range(0, 140, 20))  # 7 arrivals while the first execution runs
CASES = [
    # delay 0, no preferred size: the batch queued behind the busy instance grows with each arrival
    Case(name="none_d0", at_ms=BURST),
    # delay 0, powers of two: each batch that reaches a preferred size is closed at once; two queue
    # ahead (2 x instances), the rest waits for a slot
    Case(name="pow2_d0", at_ms=BURST, preferred=(1, 2, 4, 8)),
    # requests of several rows, a gap, a second burst
    Case(name="pow2_d0_rows", at_ms=(0, 20, 40, 60, 80, 100, 400, 420, 440, 460),
         rows=(1, 2, 1, 3, 1, 2, 2, 1, 1, 4), preferred=(1, 2, 4, 8)),
    # delay > 0: the first batch waits the delay; the next, queued, is not woken by arrivals below the
    # next preferred size, so later ones form a batch of their own
    # (the first batch closes 40 ms after its last arrival; the lone one's delay ends 55 ms before
    # the next arrival; a late arrival after the instance frees forms its own batch just the same)
    Case(name="none_delay", at_ms=(0, 20, 40, 60, 110, 265, 280), delay_us=100_000),
    Case(name="pow2_delay", at_ms=(0, 20, 40, 60, 80, 100, 120, 140, 160), delay_us=100_000,
         preferred=(1, 2, 4, 8)),
    # delay > 0, preferred 2 and 4: batches queued behind the busy instance, closed past the largest
    # preferred size, merge when the instance takes them (older than the delay: InstanceQueue::Dequeue)
    Case(name="merge", at_ms=tuple(range(0, 200, 20)), delay_us=50_000, preferred=(2, 4)),
    # two instances, mixed lengths without ragged batching
    Case(name="two_instances", at_ms=(0, 20, 40, 60, 80, 100, 120, 140, 160, 180, 300, 320),
         lengths=(4, 4, 8, 8, 8, 4, 4, 4, 8, 8, 8, 4), preferred=(1, 2, 4, 8), instances=2, ragged=False),
    # a bounded queue: no batch is formed ahead, and arrivals past the limit are refused
    Case(name="queue_size", at_ms=BURST + (140, 160), max_batch_size=4, max_queue_size=3),
    # a queue timeout: REJECT fails the expired requests, DELAY sends them behind the others
    Case(name="timeout_reject", at_ms=(0, 20, 40, 150, 260), max_batch_size=4, timeout_us=100_000),
    Case(name="timeout_delay", at_ms=(0, 20, 40, 150, 260), max_batch_size=4, timeout_us=100_000,
         action="DELAY"),
]


def slow_model(repo: Path, case: Case) -> None:
    """The echo model, sleeping `SLOW_S` per execution, configured as `case` says."""
    (repo / case.name / "1").mkdir(parents=True)
    code = (ECHO / "1" / "model.py").read_text()
    assert "time.sleep(0.002)" in code
    (repo / case.name / "1" / "model.py").write_text(code.replace("time.sleep(0.002)", f"time.sleep({SLOW_S})"))
    config = modelconfig.load(ECHO / "config.pbtxt")
    config.name = case.name
    config.max_batch_size = case.max_batch_size
    batching = config.dynamic_batching
    batching.max_queue_delay_microseconds = case.delay_us
    batching.preferred_batch_size.extend(case.preferred)
    if case.max_queue_size or case.timeout_us:
        policy = batching.default_queue_policy
        policy.max_queue_size = case.max_queue_size
        policy.default_timeout_microseconds = case.timeout_us
        policy.timeout_action = getattr(type(policy), case.action)
    config.instance_group[0].count = case.instances
    config.input[0].allow_ragged_batch = case.ragged
    (repo / case.name / "config.pbtxt").write_text(modelconfig.to_text(config))


def model(repo: Path, name: str, *, ragged: bool) -> None:
    """The echo model under `name`, its input variable, ragged batching on or off."""
    shutil.copytree(ECHO / "1", repo / name / "1")
    config = modelconfig.load(ECHO / "config.pbtxt")
    config.name = name
    config.max_batch_size = MAX_BATCH
    config.dynamic_batching.max_queue_delay_microseconds = DELAY_US
    config.input[0].allow_ragged_batch = ragged
    (repo / name / "config.pbtxt").write_text(modelconfig.to_text(config))


@pytest.fixture(scope="module")
def server(triton_install, tmp_path_factory):
    repo = tmp_path_factory.mktemp("conformance")
    model(repo, "equal", ragged=False)
    model(repo, "ragged", ragged=True)
    for case in CASES:
        slow_model(repo, case)
    names = ["equal", "ragged", *(case.name for case in CASES)]
    with LocalLauncher(repo, models=names, install=triton_install) as launcher:
        yield launcher, repo


def send(address: str, name: str, requests: Requests) -> tuple[list[int], float, np.ndarray]:
    """Each request at its due time from now (its rows x length); the HTTP status of each, how
    late (ms) the latest request was sent, and when (s from the start) each response came."""
    codes = [0] * len(requests)
    late = [0.0] * len(requests)
    done = np.full(len(requests), np.nan)
    start = time.perf_counter()

    def infer(k: int) -> None:
        rows, length = int(requests.rows[k]), int(requests.length[k])
        body = {"inputs": [{"name": "INPUT_IDS", "shape": [rows, length], "datatype": "INT32",
                            "data": [1] * (rows * length)}]}
        request = urllib.request.Request(f"http://{address}/v2/models/{name}/infer", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        late[k] = (time.perf_counter() - start - float(requests.due_s[k])) * 1e3
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                codes[k] = response.status
        except urllib.error.HTTPError as error:
            codes[k] = error.code
        done[k] = time.perf_counter() - start

    threads = []
    for k, due in enumerate(requests.due_s.tolist()):
        time.sleep(max(0.0, start + due - time.perf_counter()))
        threads.append(threading.Thread(target=infer, args=(k,)))
        threads[-1].start()
    for thread in threads:
        thread.join()
    return codes, max(late), done


def executions(launcher, name: str) -> dict[int, tuple[int, int]]:
    """Triton's executions per batch size so far: size -> (count, total compute ns)."""
    stats = launcher.statistics(name)  # the model's entry of v2/models/<name>/stats
    return {int(item["batch_size"]): (int(item["compute_infer"]["count"]), int(item["compute_infer"]["ns"]))
            for item in stats.get("batch_stats", []) if int(item["compute_infer"]["count"])}


def executions_counting(launcher, name: str, before: dict[int, tuple[int, int]], *, rows: int):
    """`executions` once they count `rows` more rows than `before` (up to 2 s): Triton records an execution's
    statistics after its responses are sent, so a run's last executions (or a warm-up's) may not count yet."""
    for _ in range(100):
        after = executions(launcher, name)
        if sum(size * (count - before.get(size, (0, 0))[0]) for size, (count, _) in after.items()) >= rows:
            break
        time.sleep(0.02)
    return after


def timed_run(launcher, name: str, requests: Requests, *, exec_ms: float) -> tuple[Counter, int, str, np.ndarray]:
    """One run of the arrivals: Triton's executions per batch size in it, its errors, why its
    timing did not hold ('' when it did: every send on time, no execution overran `exec_ms`), and
    when (s) each response came."""
    before = executions(launcher, name)
    codes, late_ms, done_s = send(launcher.endpoints.http, name, requests)
    after = executions_counting(launcher, name, before, rows=int(requests.rows[np.asarray(codes) == 200].sum()))
    batches, longest_ms = Counter(), 0.0
    for size, (count, ns) in after.items():
        count0, ns0 = before.get(size, (0, 0))
        if count > count0:
            batches[size] = count - count0
            longest_ms = max(longest_ms, (ns - ns0) / (count - count0) / 1e6)  # a mean: exact for one
    void = []
    if late_ms > LATE_MS:
        void.append(f"a request sent {late_ms:.0f} ms late")
    if longest_ms > exec_ms + LATE_MS:
        void.append(f"an execution of {longest_ms:.0f} ms")
    return batches, sum(code != 200 for code in codes), ", ".join(void), done_s


def batcher_of(config_path: Path) -> BatcherConfig:
    """The simulator's configuration, read from the config.pbtxt Triton loaded."""
    config = modelconfig.load(config_path)
    batching = config.dynamic_batching
    policy = batching.default_queue_policy
    return BatcherConfig(max_batch_size=config.max_batch_size,
                         max_queue_delay_microseconds=batching.max_queue_delay_microseconds,
                         preferred_batch_size=tuple(batching.preferred_batch_size) or None,
                         instance_count=max(1, config.instance_group[0].count),
                         max_queue_size=policy.max_queue_size,
                         default_timeout_microseconds=policy.default_timeout_microseconds,
                         timeout_action="delay" if policy.timeout_action == type(policy).DELAY else "reject",
                         equal_shapes=equal_shapes_of(config))


def race_outcomes(config_path: Path, requests: Requests, *, exec_ms: float) -> dict[str, tuple[Counter, int, np.ndarray]]:
    """Every outcome the race at each execution end allows (`simulate`'s `instance_first`, end by end):
    the simulator's executions per batch size (rows), its count of failed requests, and when each
    request's response leaves Triton (s), once per distinct outcome, named by its winners at the ends
    that happened (I: the instance, B: the batcher). No run has more ends than requests."""
    config = batcher_of(config_path)
    profile = Profile.from_function(lambda rows, length: exec_ms, rows=[1, config.max_batch_size], lengths=[4, 8],
                                    concurrent_executions=config.instance_count)  # sleeps run side by side
    outcomes, seen = {}, set()
    for winners in itertools.product((True, False), repeat=len(requests.due_s)):
        run = simulate(requests, config, profile, instance_first=winners)
        batches, errors = Counter(run.exec_rows.tolist()), int((run.status != OK).sum())
        key = (tuple(sorted(batches.items())), errors, tuple(np.round(run.done_s, 9).tolist()))
        if key not in seen:
            seen.add(key)
            ends = "".join("I" if w else "B" for w in winners[:len(run.exec_rows)])
            outcomes[f"race winners {ends}"] = (batches, errors, run.done_s)
    return outcomes


def drift_ms(done_s: np.ndarray, sim_done_s: np.ndarray) -> float:
    """How far the responses strayed from a simulated outcome (ms): the largest jump of their offset from
    it, in the simulation's order of completion (the first response's offset counts as a jump from 0).
    A stall or another batch shows as a jump; the few ms each execution runs over its sleep add up
    along a chain of executions (CI: 22 ms over ten), and are not one."""
    done = ~np.isnan(sim_done_s) & ~np.isnan(done_s)
    order = np.argsort(sim_done_s[done], kind="stable")
    offset = (done_s[done] - sim_done_s[done])[order]
    return float(np.abs(np.diff(offset, prepend=0.0)).max()) * 1e3 if len(offset) else 0.0


def conforming_run(launcher, config_path: Path, name: str, requests: Requests, *, exec_ms: float, instances: int = 1):
    """Runs of `requests` against Triton until one keeps the scripted timing (up to `ATTEMPTS`); its
    executions per batch size and errors must be the simulation's, and its responses on the
    simulation's time. Returns them."""
    # an execution's end is a race between its instance and the batcher (`simulate`'s `instance_first`), run
    # again at every end: a run must be one of the outcomes, batch for batch, and keep to its timing
    outcomes = race_outcomes(config_path, requests, exec_ms=exec_ms)
    # an instance's first execution runs late (a fresh Python backend process): one request per instance,
    # each sent while the ones before it execute, warms them; a run counts from once their statistics are in
    # (CI: the second warm-up's execution, recorded late, was counted in the run)
    before = executions(launcher, name)
    send(launcher.endpoints.http, name, Requests(due_s=np.arange(instances) * 0.02,
                                                 rows=np.ones(instances, dtype=np.int64),
                                                 length=np.full(instances, 4, dtype=np.int64)))
    executions_counting(launcher, name, before, rows=instances)
    voided = []
    for _ in range(ATTEMPTS):
        batches, errors, void, done_s = timed_run(launcher, name, requests, exec_ms=exec_ms)
        # a stall the checks of `timed_run` cannot see (a response held up, the batcher woken late) shows as
        # responses later than the simulation's
        off_ms = {key: drift_ms(done_s, sim_done) for key, (*_, sim_done) in outcomes.items()}
        key = min(off_ms, key=off_ms.get)  # the outcome whose timing it kept, if any
        if not void and off_ms[key] <= LATE_MS:
            print(f"{name}: {key}, responses strayed {off_ms[key]:.1f} ms at most from the simulation's; "
                  f"runs voided before this one: {voided or 'none'}")
            assert (batches, errors) == outcomes[key][:2], (
                f"responses at {np.round(done_s * 1e3).tolist()} ms, simulated at "
                f"{np.round(outcomes[key][2] * 1e3).tolist()} ms")
            return batches, errors
        nearest = sorted(off_ms, key=off_ms.get)[:2]  # of up to hundreds of outcomes, the two nearest
        off = ", ".join(f"{off_ms[key]:.0f} ms off {key}" for key in nearest)
        voided.append(f"{void or 'sends and executions on time'}; responses up to {off} "
                      f"(Triton formed {dict(batches)}, responses at {np.round(done_s * 1e3).tolist()} ms)")
    expected = {key: (dict(batches), errors) for key, (batches, errors, _) in list(outcomes.items())[:4]}
    pytest.fail(f"no run of {ATTEMPTS} kept the scripted timing (the machine too busy, or Triton's batches not "
                f"the simulation's {expected}): {'; '.join(voided)}")


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_the_simulated_batches_and_errors_are_tritons(server, case):
    launcher, repo = server
    conforming_run(launcher, repo / case.name / "config.pbtxt", case.name, case.requests(), exec_ms=SLOW_S * 1e3,
                   instances=case.instances)


@pytest.mark.parametrize(("name", "expected"), [("equal", {3: 1, 2: 2}), ("ragged", {7: 1})])
def test_the_simulated_batches_are_tritons(server, name, expected):
    launcher, repo = server
    requests = Requests(due_s=np.arange(len(LENGTHS)) * SPACING_S, rows=np.ones(len(LENGTHS), dtype=np.int64),
                        length=np.asarray(LENGTHS, dtype=np.int64))
    batches, _ = conforming_run(launcher, repo / name / "config.pbtxt", name, requests, exec_ms=2.0)
    assert batches == expected  # and what the rule says: [4 4 4] [8 8] [4 4], or all seven padded
