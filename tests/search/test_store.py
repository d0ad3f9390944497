"""The study's storage, opened by several processes at once (tuner.search._store)."""

from __future__ import annotations

import multiprocessing

from tuner.search._store import open_storage

PROCESSES = 4


def _open_together(url: str, barrier) -> str:
    barrier.wait(timeout=120)  # every process checks for the tables, then creates them, at the same moment
    try:
        open_storage(url)
    except Exception as exc:  # noqa: BLE001  the test reports what each process met
        return f"{type(exc).__name__}: {exc}"
    return "ok"


def test_processes_creating_the_same_new_sqlite_database_all_open_it(tmp_path):
    # `tuner tune` on two hosts, or a study's workers, started together on a database not yet made: one
    # process creates each table and the others lost the race ("table studies already exists")
    context = multiprocessing.get_context("fork")
    outcomes = []
    with context.Manager() as manager, context.Pool(PROCESSES) as pool:
        barrier = manager.Barrier(PROCESSES)  # passed by every process in each round, then used again
        for i in range(8):
            url = f"sqlite:///{tmp_path / f'{i}.db'}"
            outcomes += pool.starmap(_open_together, [(url, barrier)] * PROCESSES, chunksize=1)
    assert outcomes == ["ok"] * len(outcomes), sorted(set(outcomes))
