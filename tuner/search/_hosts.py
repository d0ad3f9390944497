"""Several hosts on one study: who measures (`Host`: machine, process, GPU type), the study's lock,
and what must be decided once for all of them:

- a host whose GPU type differs from the study's first host's is refused (a capacity on an L4 is not
  one on an A100), unless the study allows it (`search.mixed_gpus`);
- in a mixed-GPU study, the incumbent is measured once per GPU type (`claim_incumbent`);
- the re-measurement of the top configurations runs on one host (`claim_finish`): the first to find
  the search over (no trial running anywhere), so that the medians it compares come from one GPU.

Each decision reads and writes the study's user attributes under `exclusive`: a PostgreSQL advisory
lock (held by a database session: a host that dies lets it go), a lock on the directory of a SQLite
or journal file (held by the process: the kernel lets it go).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import optuna
from optuna.trial import TrialState

from tuner.errors import SettingsError
from tuner.localhost import gpu_type, pid_alive
from tuner.search._results import finished_count
from tuner.search._urls import first_line, is_journal, safe_url
from tuner.settings import StudySettings


@dataclass(frozen=True)
class Host:
    """Who measures: the machine's name, the process and the GPU type (recorded on every trial)."""

    name: str
    pid: int
    gpu: str

    def as_dict(self) -> dict:
        """`host`, `pid`, `gpu`: the trial attributes that say where it was measured."""
        return {"host": self.name, "pid": self.pid, "gpu": self.gpu}


def this_host() -> Host:
    """This process on this machine, with the machine's GPU type (`tuner.localhost.gpu_type`)."""
    return Host(socket.gethostname(), os.getpid(), gpu_type())


@contextlib.contextmanager
def exclusive(url: str, name: str) -> Iterator[None]:
    """Hold study `name`'s lock in storage `url`: one process at a time, on any host, until the block
    ends (or the process dies). PostgreSQL: an advisory lock; SQLite and journal files: a lock on the
    file's directory; another database: no lock (two hosts may then both re-measure)."""
    if url.startswith(("postgresql", "postgres://")):
        import sqlalchemy

        key = int.from_bytes(hashlib.sha256(f"tuner:{name}".encode()).digest()[:8], "big", signed=True)
        try:
            engine = sqlalchemy.create_engine(url, poolclass=sqlalchemy.pool.NullPool)
            connection = engine.connect()
        except Exception as exc:  # noqa: BLE001  missing driver, unreachable database, credentials
            raise SettingsError(f"storage {safe_url(url)}: cannot open: {first_line(exc, url)}") from None
        try:
            connection.execute(sqlalchemy.text("SELECT pg_advisory_lock(:key)"), {"key": key})
            yield
        finally:
            connection.close()  # ends the session, and with it the lock
            engine.dispose()
        return
    path = Path(url[len("sqlite:///"):]) if url.startswith("sqlite:///") else Path(url) if is_journal(url) else None
    if path is None or str(path) in ("", ".", ":memory:"):
        yield
        return
    # the file's directory, not the file: the storage file appears only with the study, whole
    path.parent.mkdir(parents=True, exist_ok=True)
    held = os.open(path.parent, os.O_RDONLY)
    try:
        fcntl.flock(held, fcntl.LOCK_EX)
        yield
    finally:
        os.close(held)  # lets the lock go


def check_gpu(study: optuna.Study, settings: StudySettings, storage: str, *, host: Host) -> None:
    """SettingsError when `host`'s GPU type is not the study's first host's and the study does not
    allow mixed GPUs, as it started (`search.mixed_gpus` of the study that made it, which a joining
    host's file must not change: its one incumbent would be compared with another GPU's search)."""
    first = study.user_attrs.get("gpu")
    if not isinstance(first, dict):
        return  # a study of an earlier tuner did not record it
    mixed = first.get("mixed")
    if mixed is not None and bool(mixed) != settings.search.mixed_gpus:
        raise SettingsError(
            f"study {settings.name!r} in {safe_url(storage)} started with search.mixed_gpus: "
            f"{str(bool(mixed)).lower()}, this study file says {str(settings.search.mixed_gpus).lower()}: a study "
            f"keeps the rule it started with (tune another GPU type in a study of its own, another name)")
    if first.get("type") == host.gpu or (settings.search.mixed_gpus if mixed is None else mixed):
        return
    raise SettingsError(
        f"study {settings.name!r} in {safe_url(storage)} is measured on {first.get('type')!r} (its first host, "
        f"{first.get('host')}), but this host ({host.name}) has {host.gpu!r}: a capacity on one GPU type is "
        f"not one on another; tune this host in a study of its own (another name), or start the study "
        f"with search.mixed_gpus: true")


def claim_incumbent(study: optuna.Study, host: Host) -> bool:
    """In a mixed-GPU study: whether this host measures the incumbent for its GPU type (no host of
    that type has claimed it, or this machine did in a process now gone, before measuring it).
    Hold `exclusive` around this."""
    claims = dict(study.user_attrs.get("incumbents") or {})
    claim = claims.get(host.gpu)
    if claim is not None:
        measured = any(t.user_attrs.get("incumbent") and t.user_attrs.get("gpu") == host.gpu
                       for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.FAIL)))
        if measured or claim.get("host") != host.name or pid_alive(claim.get("pid")):
            return False
    claims[host.gpu] = host.as_dict()
    study.set_user_attr("incumbents", claims)
    return True


def claim_finish(study: optuna.Study, host: Host, *, force: bool = False) -> dict | None:
    """Who re-measures the top configurations of the study as it stands: None when this host does
    (or the re-measurement of these trials is done: the outputs are written from the storage), else
    what this host should say: the host that does, or a trial another host still measures (that host
    finishes later, and re-measures then). A claim on the same trials by a process gone from this
    machine, or `force` (`tuner finish`), is taken over. Hold `exclusive` around this."""
    round_ = finished_count(study)
    if not force:
        running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
        if running:
            t = running[0]
            return {"running": t.number, "host": t.user_attrs.get("host"), "pid": t.user_attrs.get("pid"),
                    "gpu": t.user_attrs.get("gpu")}
        if study.user_attrs.get("remeasured_at") == round_ and "remeasured" in study.user_attrs:
            return None
        claim = study.user_attrs.get("finishing")
        if (isinstance(claim, dict) and claim.get("round") == round_ and claim.get("pid") != host.pid
                and (claim.get("host") != host.name or pid_alive(claim.get("pid")))):
            return claim
    study.set_user_attr("finishing", {"round": round_, **host.as_dict(),
                                      "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
    return None
