"""A private PostgreSQL cluster for the tests: `initdb` + `pg_ctl` in a temporary directory, bound to
127.0.0.1 on a free port, password authentication, stopped and removed at the end.

Debian's `postgresql` package provides the binaries (scripts/run-tests.sh installs it as root). As
root, `initdb` refuses to run: the cluster then runs as Debian's unprivileged `postgres` user (its
directory given to that user); as anyone else, as the current user. Without the binaries, the driver
(`pip install -e '.[postgres]'`) or, as root, a `postgres` user, the tests that need it skip saying
why, unless TUNER_REQUIRE_POSTGRES=1 or TUNER_REQUIRE_ALL=1 (CI), where they fail instead.

A cluster left by a test run killed outright (kill -9 skips every `finally`) is stopped and removed by
the next run: its directory records the pid of the process that made it.
"""

from __future__ import annotations

import contextlib
import glob
import importlib.util
import os
import pwd
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tuner.localhost import OWNER_FILE, free_ports, pid_alive

PREFIX = "tuner-test-pg-"
USER = "tuner"  # the cluster's superuser, with a password (what a shared database would have)
START_TIMEOUT_S = 60


def unavailable(reason: str):
    """Skip the test saying why, or fail it where every part is required (CI)."""
    for required in ("TUNER_REQUIRE_POSTGRES", "TUNER_REQUIRE_ALL"):
        if os.environ.get(required) == "1":
            pytest.fail(f"{required}=1 but {reason}", pytrace=False)
    pytest.skip(reason)


def find_binaries() -> Path | None:
    """The directory holding initdb and pg_ctl: Debian's newest /usr/lib/postgresql/N/bin, else PATH."""
    def version(path: str) -> int:
        found = re.search(r"/postgresql/(\d+)/", path)
        return int(found.group(1)) if found else 0

    for candidate in sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=version, reverse=True):
        if (Path(candidate) / "initdb").is_file() and (Path(candidate) / "pg_ctl").is_file():
            return Path(candidate)
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb and shutil.which("pg_ctl") else None


@dataclass(frozen=True)
class Cluster:
    """A running private cluster: where it listens and how to reach a database in it."""

    port: int
    password: str
    directory: Path
    binaries: Path
    run_as: str | None  # the user the server runs as (root: `postgres`), None: this user

    def url(self, database: str = "postgres", *, password: str | None = None, with_password: bool = True) -> str:
        """`postgresql://tuner:PASSWORD@127.0.0.1:PORT/DATABASE` (no password: the client takes
        $PGPASSWORD)."""
        secret = f":{password if password is not None else self.password}" if with_password else ""
        return f"postgresql://{USER}{secret}@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str) -> str:
        """A new empty database; returns its URL."""
        import psycopg

        # CREATE DATABASE cannot run in a transaction
        with psycopg.connect(host="127.0.0.1", port=self.port, user=USER, password=self.password,
                             dbname="postgres", autocommit=True) as connection:
            connection.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)


def _as_owner(command: list[str], run_as: str | None) -> list[str]:
    return ["runuser", "-u", run_as, "--", *command] if run_as else command


def _run(command: list[str], run_as: str | None, what: str, timeout: float = START_TIMEOUT_S) -> None:
    done = subprocess.run(_as_owner(command, run_as), capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"{what} failed ({done.returncode}): {(done.stderr or done.stdout).strip()[-1500:]}")


def _stop(directory: Path, binaries: Path, run_as: str | None, mode: str = "fast") -> None:
    data = directory / "data"
    if (data / "postmaster.pid").is_file():  # pg_ctl signals the pid the server recorded there
        subprocess.run(_as_owner([str(binaries / "pg_ctl"), "-D", str(data), "-m", mode, "-w", "stop"], run_as),
                       capture_output=True, timeout=START_TIMEOUT_S)
    shutil.rmtree(directory, ignore_errors=True)


def sweep(binaries: Path, run_as: str | None) -> list[Path]:
    """Stop and remove the clusters of earlier test runs whose process is gone; returns them."""
    removed = []
    for directory in Path(tempfile.gettempdir()).glob(f"{PREFIX}*"):
        try:
            owner = (directory / OWNER_FILE).read_text().strip()
        except OSError:
            continue
        if not pid_alive(owner):
            _stop(directory, binaries, run_as, mode="immediate")
            removed.append(directory)
    return removed


def _run_as() -> str | None:
    # initdb refuses root: the server then runs as Debian's unprivileged user
    return pwd.getpwnam("postgres").pw_name if os.geteuid() == 0 else None


def missing() -> str | None:
    """Why a private cluster cannot be started here (None: it can)."""
    if find_binaries() is None:
        return ("PostgreSQL's initdb and pg_ctl are not installed (as root: apt-get install postgresql; "
                "scripts/run-tests.sh does it)")
    if importlib.util.find_spec("psycopg") is None:
        return "the PostgreSQL driver is not installed: pip install -e '.[postgres]'"
    try:
        _run_as()
    except KeyError:
        return "running as root, and there is no unprivileged `postgres` user to run the cluster as"
    return None


@contextlib.contextmanager
def private_cluster() -> Iterator[Cluster]:
    """Start a private cluster (see `missing` first); RuntimeError, with the server's log, when it
    does not start."""
    binaries = find_binaries()
    run_as = _run_as()
    sweep(binaries, run_as)
    directory = Path(tempfile.mkdtemp(prefix=PREFIX))
    (directory / OWNER_FILE).write_text(str(os.getpid()))
    password = os.urandom(9).hex()
    (directory / "password").write_text(password + "\n")
    if run_as:
        entry = pwd.getpwnam(run_as)
        for path in (directory, directory / "password"):
            os.chown(path, entry.pw_uid, entry.pw_gid)
    (port,) = free_ports(1)
    data = directory / "data"
    try:
        _run([str(binaries / "initdb"), "-D", str(data), "-U", USER, "--pwfile", str(directory / "password"),
              "--auth=scram-sha-256", "-E", "UTF8", "--locale=C", "--no-sync"], run_as, "initdb")
        # loopback only, no Unix socket; durability is not what the tests need
        options = (f"-c listen_addresses=127.0.0.1 -p {port} -c unix_socket_directories='' -c fsync=off "
                   f"-c synchronous_commit=off -c full_page_writes=off -c max_connections=200")
        _run([str(binaries / "pg_ctl"), "-D", str(data), "-l", str(directory / "server.log"), "-o", options,
              "-w", "-t", str(START_TIMEOUT_S), "start"], run_as, "pg_ctl start", timeout=START_TIMEOUT_S + 10)
    except (RuntimeError, subprocess.TimeoutExpired) as exc:
        log = directory / "server.log"
        tail = log.read_text()[-1500:] if log.is_file() else ""
        _stop(directory, binaries, run_as, mode="immediate")
        raise RuntimeError(f"the private PostgreSQL cluster did not start: {exc}\n{tail}") from None
    try:
        yield Cluster(port, password, directory, binaries, run_as)
    finally:
        _stop(directory, binaries, run_as)
