"""Where a study lives: Optuna's RDB storage (SQLite by default, PostgreSQL for several hosts) with
heartbeats, so that a trial whose worker died is failed after a grace period and run again by another
(`RetryHeartbeatStaleTrialCallback`); a journal file of an earlier tuner is still opened to resume.

A study remembers what it measured against (`identity`: model, base config, traffic, SLA, price,
space, scoring) and the GPU type of the host that made it; resuming it with any of those changed, or
joining it from a host with another GPU type (unless `search.mixed_gpus`), would mix incomparable
trials, so it is refused.

Several hosts starting on one study at once hold its lock around `open_study` (`_hosts.exclusive`).
"""

from __future__ import annotations

import contextlib
import json
import time
import warnings
import weakref
from pathlib import Path

import optuna
from optuna.trial import TrialState

from tuner import paths
from tuner.errors import SettingsError
from tuner.search._hosts import Host, check_gpu
from tuner.search._urls import JOURNAL_SUFFIXES, check_scheme, first_line, is_journal, safe_url, sqlite_path
from tuner.settings import SearchSettings, StudySettings

DEFAULT_STORAGE_FILE = "study.db"
JOURNAL_FILE = "study.journal"
CREATE_TRIES = 5  # the default of earlier versions: still resumed where it exists
SQLITE_MAGIC = b"SQLite format 3\x00"
CONNECT_TIMEOUT_S = 5  # `--check` reaching a database server: long enough for a remote one, no hang


def storage_url(settings: StudySettings, override: str | None = None) -> str:
    """The study's storage: an Optuna URL (sqlite:///..., postgresql://...) or a journal file path;
    by default a SQLite file in the output directory (or the journal an earlier run left there)."""
    if override or settings.storage:
        return override or settings.storage
    journal = Path(settings.output) / JOURNAL_FILE
    with contextlib.suppress(OSError):  # an output path the OS refuses: its own check says why
        if journal.is_file():
            return str(journal)
    return f"sqlite:///{Path(settings.output) / DEFAULT_STORAGE_FILE}"


def check_storage(url: str, *, connect: bool = False, write: bool = False) -> None:
    """Refuse, before anything is written, a storage that is not one: a URL SQLAlchemy cannot parse
    or with a scheme it does not know; a plain path that neither is an Optuna journal already nor
    is named like one (*.journal, *.log); a `sqlite:///` file that exists and is no SQLite database;
    a file's name the OS refuses (too long, a symbolic-link loop), and with `write` a file that
    cannot be written there (tuner.paths: its directory must take a new file, as the journal's lock
    and SQLite's own journal are made beside it). With `connect`, a database server is reached (a
    short timeout) and left as it was: no table is made (`tune --check`). One line naming the
    storage (SettingsError)."""
    where = f"storage {safe_url(url)}"
    if is_journal(url):
        _check_journal_path(Path(url), where)
        _check_file(url, where, write=write)
        return
    try:
        check_scheme(url)
    except ValueError as exc:
        raise SettingsError(f"{where}: {exc}") from None
    database = sqlite_path(url)
    if database is not None:
        if _check_existing(Path(database), where, _is_sqlite, kind="an SQLite database"):
            tables = _sqlite_tables(database)
            if tables and "studies" not in tables:  # a database of the user's: Optuna would add its tables
                raise SettingsError(f"{where}: an SQLite database that is not an Optuna storage (its tables: "
                                    f"{', '.join(tables[:5])}{', ...' if len(tables) > 5 else ''}): refusing to "
                                    f"write into it")
        _check_file(database, where, write=write)
    elif connect and url.startswith(("postgresql", "mysql", "mariadb")):
        _reach(url, where)


def _check_file(path: str, where: str, *, write: bool) -> None:
    """A storage file's path, as every path a user gives is checked (tuner.paths); nothing is made."""
    if write:
        paths.writable_file(path, label=where, error=SettingsError)
    else:  # read (export, report): what is missing or read-only is left to the step that opens it
        paths.nameable(path, label=where, error=SettingsError)


def _check_journal_path(path: Path, where: str) -> None:
    if _check_existing(path, where, _is_journal, kind="an Optuna journal"):
        return
    if path.suffix not in JOURNAL_SUFFIXES:
        raise SettingsError(
            f"{where}: neither a storage URL (e.g. sqlite:///PATH, postgresql://USER@HOST/DB) nor a journal "
            f"file (a name ending in {' or '.join(JOURNAL_SUFFIXES)}, or an existing Optuna journal)")


def _check_existing(path: Path, where: str, is_kind, *, kind: str) -> bool:
    """Whether a non-empty file is at `path` (then it must be of `kind`); an empty one is new."""
    try:
        if path.is_dir():
            raise SettingsError(f"{where}: is a directory, not {kind}")
        if not path.is_file() or path.stat().st_size == 0:
            return False
        with open(path, "rb") as fh:
            head = fh.read(1 << 16)
    except OSError:  # a name the OS refuses, no permission: nothing read, opening it says why
        return False
    if not is_kind(head):
        raise SettingsError(f"{where}: exists and is not {kind}: refusing to write into it")
    return True


def _sqlite_tables(path: str) -> list[str]:
    """The tables of the SQLite database at `path`, read without writing (a read-only connection: not
    even SQLite's journal is made); [] where it cannot be read (opening it later says why)."""
    import sqlite3

    try:
        with contextlib.closing(sqlite3.connect(f"{Path(path).resolve().as_uri()}?mode=ro", uri=True)) as db:
            return sorted(row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'"))
    except sqlite3.Error:
        return []


def _is_sqlite(head: bytes) -> bool:
    return head.startswith(SQLITE_MAGIC)


def _is_journal(head: bytes) -> bool:
    """An Optuna journal: JSON lines, each an operation (`op_code`)."""
    first = head.split(b"\n", 1)[0]
    try:
        record = json.loads(first)
    except ValueError:
        return False
    return isinstance(record, dict) and "op_code" in record


def _reach(url: str, where: str) -> None:
    """Connect to the database server once and leave (no schema is made)."""
    from sqlalchemy import create_engine

    engine = None
    try:
        engine = create_engine(url, connect_args={"connect_timeout": CONNECT_TIMEOUT_S})
        with engine.connect():
            pass
    except Exception as exc:  # noqa: BLE001  missing driver, unreachable server, credentials
        raise SettingsError(f"{where}: cannot open: {first_line(exc, url)}") from None
    finally:
        if engine is not None:
            engine.dispose()


def open_storage(url: str, search: SearchSettings | None = None) -> optuna.storages.BaseStorage:
    """The storage behind `url` (checked first: `check_storage`). A database gets heartbeats (from
    `search`, when given): a RUNNING trial silent for the grace period is failed and enqueued once
    more. Bad URL, missing driver, unreachable database, wrong credentials: one line (SettingsError)."""
    check_storage(url)
    if is_journal(url):
        path = Path(url)
        path.parent.mkdir(parents=True, exist_ok=True)
        backend = optuna.storages.journal.JournalFileBackend(
            str(path), lock_obj=optuna.storages.journal.JournalFileOpenLock(str(path)))
        return optuna.storages.JournalStorage(backend)
    database = sqlite_path(url)
    new_file = database is not None and not Path(database).exists()
    if database is not None:
        Path(database).parent.mkdir(parents=True, exist_ok=True)
    try:
        return _open_rdb(url, search)
    except SettingsError:
        if new_file:  # a full disk: no empty database left behind for the next run to trip on
            _remove_if_empty(Path(database))
        raise


def _remove_if_empty(path: Path) -> None:
    try:
        if path.stat().st_size == 0:
            path.unlink()
    except OSError:
        pass


def beat_now(trial: optuna.Trial) -> None:
    """Write the trial's first heartbeat at once. Optuna's heartbeat thread writes it whenever that
    thread is first scheduled, and Optuna never finds a RUNNING trial without a heartbeat stale (its
    RDBStorage._get_stale_trial_ids skips it): a worker killed in between (seen under load, after the
    trial had drawn its configuration) left a trial that the other workers waited for for good. Through
    the storage `open_study` opened (Optuna gives no public handle to a study's storage or a trial's id);
    a study opened otherwise, or a journal (no heartbeats), is left as it is."""
    backend = _BACKENDS.get(trial.study)
    interval = getattr(backend, "get_heartbeat_interval", None)
    if interval is None or interval() is None:
        return
    study_id = backend.get_study_id_from_name(trial.study.study_name)
    backend.record_heartbeat(backend.get_trial_id_from_study_id_trial_number(study_id, trial.number))


# the storage each study open_study opened, for beat_now
_BACKENDS: weakref.WeakKeyDictionary[optuna.Study, optuna.storages.BaseStorage] = weakref.WeakKeyDictionary()


def _open_rdb(url: str, search: SearchSettings | None) -> optuna.storages.BaseStorage:
    heartbeat = {}
    for attempt in range(CREATE_TRIES):
        try:
            with warnings.catch_warnings():  # heartbeats are marked experimental in Optuna
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                if search is not None:
                    heartbeat = {"heartbeat_interval": search.heartbeat_s, "grace_period": search.grace_period_s,
                                 "heartbeat_stale_trial_callback": _RetryStaleTrial()}
                storage = optuna.storages.RDBStorage(url, engine_kwargs=_engine_kwargs(url), **heartbeat)
            if url.startswith("sqlite"):
                _serialize_sqlite(storage.engine)
            return storage
        except Exception as exc:  # noqa: BLE001  bad URL, missing driver, unreachable database, credentials
            if _lost_schema_race(exc) and attempt + 1 < CREATE_TRIES:
                time.sleep(0.2 * (attempt + 1))
                continue
            raise SettingsError(f"storage {safe_url(url)}: cannot open: {first_line(exc, url)}") from None
    raise AssertionError("unreachable")


def _lost_schema_race(exc: Exception) -> bool:
    """Whether `exc` is a process losing the race to create a new database's tables to another (workers,
    hosts, a study's first runs started together): PostgreSQL's catalog says IntegrityError, SQLite's
    `table ... already exists` (each checks for a table, then creates it). Opening it again finds them."""
    text = type(exc).__name__ + str(exc)[:200]
    return "IntegrityError" in text or "already exists" in text


def _serialize_sqlite(engine) -> None:
    """Every SQLite transaction takes the write lock as it begins (BEGIN IMMEDIATE). Optuna pops a
    waiting trial by reading it, then marking it running; PostgreSQL locks the row for that (SELECT ...
    FOR UPDATE), SQLite ignores the hint, so two worker processes could both take the same trial. The
    SQLAlchemy recipe for serializable SQLite transactions; the pool is emptied so that every
    connection gets it."""
    from sqlalchemy import event

    @event.listens_for(engine, "connect")
    def _no_implicit_begin(dbapi_connection, _record) -> None:
        dbapi_connection.isolation_level = None  # SQLAlchemy emits the BEGIN, below

    @event.listens_for(engine, "begin")
    def _begin_immediate(connection) -> None:
        connection.exec_driver_sql("BEGIN IMMEDIATE")

    engine.dispose()


class _RetryStaleTrial(optuna.storages.RetryHeartbeatStaleTrialCallback):
    """Optuna's retry of a trial whose worker died (once), also for a trial whose parameters lie
    outside the search's ranges: an incumbent, enqueued with them. Optuna's copy would validate them
    against the ranges and refuse (ValueError, out of the trial loop); it is enqueued again the way
    it was, by its fixed parameters."""

    def __init__(self) -> None:
        super().__init__(max_retry=1)

    def __call__(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        try:
            super().__call__(study, trial)
        except ValueError:
            if "fixed_params" not in trial.system_attrs:
                raise
            history = [*trial.system_attrs.get("retry_history", []), trial.number]
            if len(history) > 1:  # retried once already
                return
            study.add_trial(optuna.trial.create_trial(
                state=TrialState.WAITING, user_attrs=trial.user_attrs,
                system_attrs={"failed_trial": trial.number, **trial.system_attrs, "retry_history": history}))


def _engine_kwargs(url: str) -> dict:
    # SQLite with several writers (workers, their heartbeats): wait for the lock instead of failing at once
    return {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {}


def open_study(settings: StudySettings, storage: str, *, sampler: optuna.samplers.BaseSampler,
               incumbent: dict | None = None, metadata: dict | None = None,
               identity: dict | None = None, host: Host | None = None, create: bool = True) -> optuna.Study:
    """Create the study, or load it to resume or to join it from another host; a new one gets the
    incumbent as its first trial (in a mixed-GPU study each GPU type measures its own: see
    `claim_incumbent`) and remembers `identity` and `host`'s GPU type, which a later one must match.
    Several hosts starting at once: hold `exclusive` around this."""
    if not create and storage.startswith("sqlite:///") and not Path(storage[len("sqlite:///"):]).is_file():
        raise SettingsError(f"{storage}: no such database file")
    backend = open_storage(storage, settings.search)
    if not create:
        names = [s.study_name for s in optuna.get_all_study_summaries(backend)]
        if settings.name not in names:
            raise SettingsError(f"{safe_url(storage)}: no study named {settings.name!r} "
                                f"(it holds: {', '.join(names) or 'none'})")
    study = optuna.create_study(study_name=settings.name, storage=backend, sampler=sampler,
                                direction="maximize", load_if_exists=True)
    _BACKENDS[study] = backend
    _check_ours(study, settings, storage)
    if study.user_attrs.get("created"):
        _check_same_study(study, settings, storage, identity=identity)
        if host is not None:
            check_gpu(study, settings, storage, host=host)
        # resumed, or joined from another host: the seed would draw the first process's configurations again
        study.sampler.reseed_rng()
        return study
    for key, value in {**(metadata or {}), "identity": identity}.items():
        study.set_user_attr(key, value)
    if host is not None:
        # the rule it starts with: a host that joins later is held to it (check_gpu), whatever its file says
        study.set_user_attr("gpu", {"type": host.gpu, "host": host.name, "mixed": settings.search.mixed_gpus})
    if incumbent is not None and not study.trials and not settings.search.mixed_gpus:
        study.enqueue_trial(incumbent, user_attrs={"incumbent": True})
    study.set_user_attr("created", True)
    return study


def check_resume(settings: StudySettings, storage: str, *, identity: dict, host: Host | None = None) -> str | None:
    """What the real run will do with a study already in `storage`, without writing a thing (`tune
    --check`): None when it starts fresh; a line saying it resumes (how many trials), or the
    SettingsError `open_study` raises when the study was measured against something else, on another
    GPU type than `host`'s, or is not tuner's. A database server is read without making Optuna's tables
    (where they are missing, the study starts fresh)."""
    path = sqlite_path(storage) or (storage if is_journal(storage) else None)
    if path is not None:
        if not Path(path).is_file() or Path(path).stat().st_size == 0:
            return None
        if sqlite_path(storage) is not None and "studies" not in _sqlite_tables(path):
            return None  # opening it would make Optuna's tables: the real run does, the dry run writes nothing
        backend = open_storage(storage)
    else:
        backend = _read_only_rdb(storage)
        if backend is None:
            return None
    if settings.name not in {s.study_name for s in optuna.get_all_study_summaries(backend)}:
        return None
    study = optuna.load_study(study_name=settings.name, storage=backend)
    _check_ours(study, settings, storage)
    if study.user_attrs.get("created"):
        _check_same_study(study, settings, storage, identity=identity)
        if host is not None:
            check_gpu(study, settings, storage, host=host)
    states = [t.state for t in study.get_trials(deepcopy=False)]
    done = sum(st == optuna.trial.TrialState.COMPLETE or st == optuna.trial.TrialState.PRUNED for st in states)
    return f"resumes study {settings.name!r}: {done} trial(s) measured of {len(states)}"


# what `open_study` writes into a study it makes, before it marks it `created` (a run stopped in between
# left some of them: that study is tuner's, and the next run finishes making it)
_OURS = ("identity", "scoring", "model", "study_file")


def _check_ours(study: optuna.Study, settings: StudySettings, storage: str) -> None:
    """Refuse a study of the same name that tuner did not make (trials or attributes, none of tuner's):
    resuming it would write tuner's attributes into someone else's study."""
    attrs = study.user_attrs
    if attrs.get("created") or any(k in attrs for k in _OURS):
        return
    if attrs or study.get_trials(deepcopy=False):
        raise SettingsError(f"study {settings.name!r} in {safe_url(storage)} was not made by tuner (it holds "
                            f"{len(study.get_trials(deepcopy=False))} trial(s) and none of tuner's records): "
                            "name another study in the study file, or use another storage")


def _read_only_rdb(url: str) -> optuna.storages.BaseStorage | None:
    """A database server's storage opened without making Optuna's tables (None where they are missing)."""
    from sqlalchemy import create_engine, inspect

    check_storage(url)
    engine = create_engine(url, connect_args={"connect_timeout": CONNECT_TIMEOUT_S})
    try:
        if "studies" not in inspect(engine).get_table_names():  # a fresh database: the run makes the tables
            return None
    except Exception as exc:  # noqa: BLE001  unreachable server, credentials (as `_reach` says them)
        raise SettingsError(f"storage {safe_url(url)}: cannot open: {first_line(exc, url)}") from None
    finally:
        engine.dispose()
    return optuna.storages.RDBStorage(url, engine_kwargs=_engine_kwargs(url), skip_table_creation=True)


def _check_same_study(study: optuna.Study, settings: StudySettings, storage: str, *, identity: dict | None) -> None:
    where = f"study {settings.name!r} in {safe_url(storage)}"
    fresh = _fresh_start(settings, storage)
    old = study.user_attrs.get("identity")
    if identity is None or old is None:  # an earlier tuner's study: it recorded only its scoring
        scoring = study.user_attrs.get("scoring")
        if scoring is not None and scoring != settings.scoring:
            raise SettingsError(f"{where} was scored by {scoring}, not {settings.scoring}: {fresh}")
        return
    changed = _changes(old, identity)
    if changed:
        key, before, after = changed[0]
        raise SettingsError(
            f"{where} was measured with another {key} ({_short(before)} -> {_short(after)})"
            + (f" and {len(changed) - 1} more change(s) ({', '.join(k for k, _, _ in changed[1:4])}"
               f"{', ...' if len(changed) > 4 else ''})" if len(changed) > 1 else "")
            + f": its trials would not compare; {fresh}")


def _fresh_start(settings: StudySettings, storage: str) -> str:
    """What starts a new study: a new output directory, where the storage lives in it; otherwise also
    a new name (the same name in the same storage is this study again, and one output directory
    holds one study's outputs)."""
    path = sqlite_path(storage) or (storage if is_journal(storage) else None)
    if path is not None and Path(path).resolve().parent == Path(settings.output).resolve():
        return "start fresh with --output NEW_DIR"
    return "start fresh with another name: in the study file and --output NEW_DIR"


# maps whose every entry is one thing measured against (a file of the model): one added is a change too
_EVERY_ENTRY = ("model_files",)


def _changes(old: object, new: object, key: str = "") -> list[tuple[str, object, object]]:
    """(key path, old, new) of every leaf that differs; a model config's text by its changed fields
    (`base_config.dynamic_batching.max_queue_delay_microseconds`), not its whole text."""
    if key in _EVERY_ENTRY and isinstance(old, dict) and isinstance(new, dict):  # a file added counts too
        return [(f"{key}.{k}", old.get(k, "absent"), new.get(k, "absent"))
                for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]
    if isinstance(old, dict) and isinstance(new, dict):
        # a key the study did not record (an earlier tuner's) is no change: what it measured against is unknown
        return [change for k in sorted(set(old) | set(new), key=str) if k in old
                for change in _changes(old.get(k), new.get(k), f"{key}.{k}" if key else str(k))]
    if old == new:
        return []
    if isinstance(old, str) and isinstance(new, str) and "\n" in old + new:
        fields = _config_changes(old, new)
        if fields:
            return [(f"{key}.{path}", a, b) for path, a, b in fields]
    return [(key, old, new)]


def _config_changes(old: str, new: str) -> list[tuple[str, object, object]]:
    from tuner import modelconfig
    from tuner.errors import ConfigError

    try:
        return modelconfig.diff_fields(modelconfig.parse(old), modelconfig.parse(new))
    except ConfigError:
        return []


def _short(value: object, limit: int = 60) -> str:
    text = " ".join(str(value).split())  # one line, whatever the value holds
    return text if len(text) <= limit else text[: limit - 3] + "..."


def load_study(storage: str, name: str | None) -> optuna.Study:
    """A study from any Optuna storage (URL or journal file); `name` may be omitted if it holds one."""
    file = storage if is_journal(storage) else sqlite_path(storage)
    if file is not None:  # a name the OS refuses: one line, before asking whether it is a file
        _check_file(file, f"storage {safe_url(storage)}", write=False)
    if is_journal(storage) and not Path(storage).is_file():
        raise SettingsError(f"{storage}: no such storage file")
    if storage.startswith("sqlite:///") and not Path(storage[len("sqlite:///"):]).is_file():
        raise SettingsError(f"{storage}: no such database file")
    backend = open_storage(storage)
    names = [s.study_name for s in optuna.get_all_study_summaries(backend)]
    if name is None:
        if len(names) != 1:
            raise SettingsError(f"{safe_url(storage)}: holds {len(names)} studies ({', '.join(names) or 'none'}): "
                                f"name one with --study")
        name = names[0]
    if name not in names:
        raise SettingsError(f"{safe_url(storage)}: no study named {name!r} (it holds: {', '.join(names) or 'none'})")
    return optuna.load_study(study_name=name, storage=backend)


def fail_dead_local_trials(study: optuna.Study, storage: optuna.storages.BaseStorage, host: str,
                           *,
                           alive) -> list[int]:
    """A journal file has no heartbeats: fail the RUNNING trials this host's dead processes left
    (`alive(pid)`), through the storage's public API. Returns their numbers."""
    study_id = storage.get_study_id_from_name(study.study_name)
    failed = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if t.user_attrs.get("host") == host and not alive(t.user_attrs.get("pid")):
            trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, t.number)
            storage.set_trial_state_values(trial_id, TrialState.FAIL)
            failed.append(t.number)
    return failed
