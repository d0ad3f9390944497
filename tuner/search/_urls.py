"""Storage URLs: which kind of storage, what may be printed, what may be written down, and one line
for an error from opening one."""

from __future__ import annotations

# What a plain path (no scheme) given as a storage must be called to be taken for a new journal file:
# the name the tuner gives its own (study.journal) and Optuna's documented `journal.log`. Anything
# else without a scheme (`garbage!!`, `postgres//user@host/db`) is a mistyped URL, not a wish for a
# file of that name; an existing file is taken only if it already is an Optuna journal.
JOURNAL_SUFFIXES = (".journal", ".log")
SQLITE_PREFIX = "sqlite:///"


def is_journal(url: str) -> bool:
    """Whether `url` is a journal file's path (an earlier tuner's storage), not an Optuna URL."""
    return "://" not in url


def sqlite_path(url: str) -> str | None:
    """The database file of a `sqlite:///PATH` URL; None for any other storage (or SQLite in memory)."""
    if not url.startswith(SQLITE_PREFIX):
        return None
    path = url[len(SQLITE_PREFIX):].split("?", 1)[0]
    return path if path and path != ":memory:" else None


def check_scheme(url: str) -> None:
    """Refuse a URL that SQLAlchemy cannot parse or whose scheme names no database it knows
    (ValueError, one line): checked before anything is opened or written."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError

    try:
        parsed = make_url(url)
        parsed.get_dialect()
    except NoSuchModuleError:  # an ArgumentError too: first
        scheme = url.split("://", 1)[0]
        hint = "; did you mean postgresql://?" if scheme == "postgres" else ""
        raise ValueError(f"unknown database scheme {scheme!r} (e.g. sqlite, postgresql, mysql){hint}") from None
    except ArgumentError:
        raise ValueError("not a storage URL (e.g. sqlite:///PATH, postgresql://USER@HOST/DB)") from None
    except ValueError:  # SQLAlchemy reads the port as a number only now: its message names neither
        port = url.split("://", 1)[-1].split("/", 1)[0].rpartition("@")[2].rpartition(":")[2]
        raise ValueError(f"the port {port!r} is not a number (e.g. postgresql://USER@HOST:5432/DB)") from None


def _credentials(url: str) -> tuple[str, str, str] | None:
    """(scheme, user[:password], host and the rest) of a URL whose host part names a user."""
    if "://" not in url:
        return None
    scheme, rest = url.split("://", 1)
    netloc, slash, path = rest.partition("/")  # credentials live before the path (a path may hold "@")
    if "@" not in netloc:
        return None
    credentials, host = netloc.rsplit("@", 1)
    return scheme, credentials, f"{host}{slash}{path}"


def safe_url(url: str) -> str:
    """The URL with its password masked (what may be printed)."""
    parts = _credentials(url)
    if parts is None or ":" not in parts[1]:
        return url
    scheme, credentials, rest = parts
    return f"{scheme}://{credentials.split(':', 1)[0]}:***@{rest}"


def without_password(url: str) -> str:
    """The URL with no password at all (what is written into the study and its summary): PostgreSQL's
    client then takes it from $PGPASSWORD or ~/.pgpass, as on any host that may read the study."""
    parts = _credentials(url)
    if parts is None:
        return url
    scheme, credentials, rest = parts
    return f"{scheme}://{credentials.split(':', 1)[0]}@{rest}"


def first_line(exc: BaseException, url: str = "") -> str:
    """The line of a storage error worth showing (the driver's own), with what to do for a missing driver."""
    text = str(exc).strip() or type(exc).__name__
    if isinstance(exc, ImportError) or "No module named" in text or "Failed to import DB access module" in text:
        install = "install the driver SQLAlchemy names for this URL"
        if url.startswith(("postgresql://", "postgresql+psycopg://")):  # psycopg 3: what tuner[postgres] installs
            install = "pip install 'tuner[postgres]'"
        elif url.startswith("postgres"):  # another driver (psycopg2, asyncpg, ...): tuner[postgres] is not it
            install += " (tuner[postgres] installs psycopg 3, for postgresql://)"
        return f"its database driver is not installed ({text.splitlines()[0]}): {install}"
    for line in text.splitlines():  # SQLAlchemy wraps the driver's message: keep its first real line
        line = line.strip()
        if line and not line.startswith("(Background on this error"):
            for driver in ("psycopg", "psycopg2", "sqlite3"):
                line = line.removeprefix(f"({driver}.OperationalError) ")
            return line
    return text
