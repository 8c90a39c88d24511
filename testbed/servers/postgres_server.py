"""A real PostgreSQL 15 of one's own: found or fetched once, a server on a directory of its own,
ended by pid, the directory removed. ``eventsrc bench fleet`` runs it, and so do the tests
(``tests/support/postgres.py``).

The binaries are, in this order: the cache when complete (env ``EVENTSRC_POSTGRES_CACHE``,
default ``/var/cache/eventsrc-tests/postgres``), else an installed ``postgresql-15``
(``/usr/lib/postgresql/15/bin``), else fetched into the cache. Nothing is installed system-wide:
``fetch()`` downloads Debian 12's ``postgresql-15``, ``libpq5`` and the libraries
``postgresql-15`` depends on through the private apt configuration of
``testbed.servers.debian_packages`` and unpacks them with ``dpkg -x``; they run from there with the
unpacked libraries first on ``LD_LIBRARY_PATH`` (so a machine that lacks one, or has other
versions, runs them all the same).
LLVM, which only the JIT loads, is not fetched: the JIT is off. To fill the cache ahead::

    python -m testbed.servers.postgres_server fetch [--cache DIR]

``PostgresServer()`` runs ``initdb`` into a new directory under /tmp and ``postgres`` on it,
listening on a unix socket in that directory only (no TCP). PostgreSQL refuses to run as root:
as root, both run as the unprivileged ``nobody`` (the directory is given to it), else as the
user running the tests or the benchmark::

    server = PostgresServer()
    server.start()                      # returns once a connection is accepted
    psycopg.connect(server.dsn)         # "host=/tmp/es-pg-... port=5432 user=eventsrc dbname=postgres"
    server.restart()                    # fast shutdown, then the same data again
    server.kill()                       # SIGKILL: crash recovery at the next start
    server.cleanup()                    # stop, then remove the directory

Only the processes it started are signalled, by their pid: the postmaster, and after a SIGKILL
its children (found by their parent pid) if they outlive it.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

from testbed.servers import debian_packages
from testbed.servers.debian_packages import FetchError
from testbed.servers.server_process import Server, alive, children, eventually, eventually_up

DEFAULT_CACHE = Path("/var/cache/eventsrc-tests/postgres")
CACHE_ENV = "EVENTSRC_POSTGRES_CACHE"
BIN_DIR = "usr/lib/postgresql/15/bin"  # in Debian's package
INSTALLED = Path("/") / BIN_DIR
# postgresql-15 and libpq5 (initdb links it), and the libraries postgresql-15 depends on, less the
# C and C++ runtimes (the machine's Python runs on them) and libllvm14 (the JIT only).
PACKAGES = tuple(
    (name, "bookworm")
    for name in (
        "postgresql-15",
        "libpq5",
        "libgssapi-krb5-2",
        "libicu72",
        "libldap-2.5-0",
        "liblz4-1",
        "libpam0g",
        "libselinux1",
        "libssl3",
        "libsystemd0",
        "libuuid1",
        "libxml2",
        "libxslt1.1",
        "libzstd1",
        "zlib1g",
    )
)
STAMP_VERSION = 1
UNPRIVILEGED_USER = "nobody"
SUPERUSER = "eventsrc"
PORT = 5432  # names the socket file in the server's own directory; no TCP port is opened
# The tests crash processes, never the machine: no fsync (``eventsrc bench fleet`` turns it on). No JIT:
# its LLVM is not fetched.
SETTINGS = {"listen_addresses": "", "fsync": "off", "jit": "off"}


# ---------------------------------------------------------------------------------------------
# The binaries


class Fetched(debian_packages.Unpacked):
    """A complete cache: the unpacked packages under ``root``."""

    @property
    def bin_dir(self) -> Path:
        return self.root / BIN_DIR

    @property
    def lib_dirs(self) -> list[Path]:
        """Where the unpacked libraries are (``usr/lib/<triplet>`` and ``lib/<triplet>``)."""
        return sorted(d for pattern in ("usr/lib/*-linux-*", "lib/*-linux-*") for d in self.root.glob(pattern))

    def required(self) -> list[Path]:
        return [self.bin_dir / "postgres", self.bin_dir / "initdb"]


@dataclass(frozen=True)
class Binaries:
    """``postgres`` and ``initdb`` in ``bin_dir``, run with ``lib_dirs`` first on the library path."""

    bin_dir: Path
    lib_dirs: tuple[Path, ...]
    source: str

    @property
    def postgres(self) -> Path:
        return self.bin_dir / "postgres"

    @property
    def initdb(self) -> Path:
        return self.bin_dir / "initdb"

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}  # the caller's PGHOST...
        if self.lib_dirs:
            env["LD_LIBRARY_PATH"] = ":".join([*map(str, self.lib_dirs), os.environ.get("LD_LIBRARY_PATH", "")])
        return env

    @classmethod
    def of(cls, fetched: Fetched) -> Binaries:
        return cls(fetched.bin_dir, tuple(fetched.lib_dirs), f"cached in {fetched.cache}")


def _check(fetched: Fetched, _progress: Callable[[str], None]) -> None:
    binaries = Binaries.of(fetched)
    for binary in (binaries.postgres, binaries.initdb):
        # ldd says which library neither the system nor the fetched packages have.
        linked = debian_packages.run(["ldd", binary], f"ldd {binary.name}", env=binaries.env(), timeout=30)
        missing = [line.split()[0] for line in linked.splitlines() if "not found" in line]
        if missing:
            raise FetchError(f"{binary.name} needs {', '.join(missing)}, in neither the system nor the packages")
        debian_packages.run([binary, "--version"], f"{binary.name} --version", env=binaries.env(), timeout=30)


ARCHIVE = debian_packages.Packages(
    Fetched, PACKAGES, version=STAMP_VERSION, default_cache=DEFAULT_CACHE, cache_env=CACHE_ENV, finish=_check
)
fetch = ARCHIVE.fetch  # fetch(cache=None, progress=...): the unpacked packages; FetchError (one line)


def binaries_or_error() -> Binaries | str:
    """The cached copy, else the installed one, else a fetched one: or why there is none (one line)."""
    if (cached := ARCHIVE.cached()) is not None:
        return Binaries.of(cached)
    if (INSTALLED / "postgres").exists() and (INSTALLED / "initdb").exists():
        return Binaries(INSTALLED, (), f"installed in {INSTALLED}")
    outcome = ARCHIVE.fetched_or_error()
    return outcome if isinstance(outcome, str) else Binaries.of(outcome)


def run_as() -> pwd.struct_passwd | None:
    """Whom the server runs as: ``nobody`` for root (PostgreSQL refuses root), else None (the
    user running the tests or the benchmark). ``KeyError`` when root and there is no ``nobody``."""
    return pwd.getpwnam(UNPRIVILEGED_USER) if os.geteuid() == 0 else None


def why_unavailable() -> str | None:
    """One line saying why a real PostgreSQL cannot be run here, or None."""
    try:
        run_as()
    except KeyError:
        return f"PostgreSQL refuses to run as root, and there is no user {UNPRIVILEGED_USER!r} to run it as"
    outcome = binaries_or_error()
    if isinstance(outcome, str):
        return f"PostgreSQL 15 fetch failed: {outcome}"
    user = run_as()
    try:  # the cache may not be readable by the unprivileged user (a umask of 077 when it was made)
        debian_packages.run(
            [outcome.postgres, "--version"],
            f"postgres --version as {user.pw_name if user else 'this user'} ({outcome.source})",
            env=outcome.env(),
            timeout=30,
            **_as(user),
        )
    except FetchError as e:
        return str(e)
    return None


def _as(user: pwd.struct_passwd | None) -> dict[str, Any]:
    """subprocess's arguments that run a command as ``user`` (None: as this process's user)."""
    return {} if user is None else {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}


# ---------------------------------------------------------------------------------------------
# A server


class PostgresServer(Server):
    """One PostgreSQL server on a data directory of its own, under a new directory of /tmp (a
    short path for its socket, reachable by the unprivileged user); ``settings`` add to or
    override ``SETTINGS``."""

    def __init__(self, *, binaries: Binaries | None = None, settings: dict[str, str] | None = None) -> None:
        self.directory = Path(tempfile.mkdtemp(prefix="es-pg-", dir="/tmp"))
        super().__init__("postgres", self.directory / "postgres.log")
        self.data_dir = self.directory / "data"
        self.settings = {**SETTINGS, **(settings or {})}
        self._binaries = binaries
        self._user = run_as()
        if self._user is not None:
            os.chown(self.directory, self._user.pw_uid, self._user.pw_gid)

    @property
    def binaries(self) -> Binaries:
        if self._binaries is None:
            outcome = binaries_or_error()
            if isinstance(outcome, str):
                raise FetchError(outcome)
            self._binaries = outcome
        return self._binaries

    @property
    def dsn(self) -> str:
        """A libpq connection string (psycopg.connect) to the server's ``postgres`` database."""
        return f"host={self.directory} port={PORT} user={SUPERUSER} dbname=postgres"

    def _as_user(self) -> dict[str, Any]:
        """subprocess's arguments that run a command as the server's user, in its directory."""
        return {"cwd": self.directory, "env": self.binaries.env(), **_as(self._user)}

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self, timeout: float = 60) -> None:
        """``initdb`` the first time, then start ``postgres`` and wait until it accepts a connection."""
        if self.running():
            return
        if not (self.data_dir / "PG_VERSION").exists():
            self._initdb()
        argv: list[str | os.PathLike[str]] = [self.binaries.postgres, "-D", self.data_dir, "-k", self.directory]
        argv += ["-p", str(PORT), *(arg for k, v in self.settings.items() for arg in ("-c", f"{k}={v}"))]
        self.spawn(argv, **self._as_user())
        eventually_up(self, self.accepts, "postgres to accept a connection", timeout)

    def _initdb(self) -> None:
        # C locale and UTF-8: the same answers on every machine, whatever locales it has.
        argv = [self.binaries.initdb, "-D", self.data_dir, "-U", SUPERUSER, "-A", "trust", "--no-sync"]
        argv += ["--locale=C", "--encoding=UTF8"]
        done = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=120, **self._as_user())
        if done.returncode != 0:
            raise RuntimeError(
                f"initdb exited {done.returncode}: {debian_packages.one_line(done.stderr + done.stdout)}"
            )

    def accepts(self) -> bool:
        """Whether the server accepts a connection now."""
        try:
            with psycopg.connect(self.dsn, connect_timeout=2):
                return True
        except psycopg.OperationalError:
            return False

    def process_tree(self) -> list[int]:
        """The postmaster's pid and its children's (the backends and the auxiliary processes)."""
        pid = self.pid
        return [] if pid is None else [pid, *children(pid)]

    def stop(self, timeout: float = 30) -> None:
        """A fast shutdown (SIGINT: sessions are ended, a checkpoint written); SIGKILL after
        ``timeout`` s. The postmaster exits after its children. Idempotent."""
        self._end(signal.SIGINT, timeout)

    def kill(self) -> None:
        """SIGKILL to the postmaster, as a crash; its children exit when they see it gone (those
        still there after 10 s are killed by pid). The next start recovers from the WAL."""
        self._end(signal.SIGKILL, 10)

    def _end(self, sig: int, timeout: float) -> None:
        tree = self.process_tree()
        self.end(sig, timeout)
        try:
            eventually(lambda: not any(map(alive, tree)), "postgres's processes to exit", timeout=timeout)
        except AssertionError:
            for pid in filter(alive, tree):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)

    def restart(self, timeout: float = 60) -> None:
        self.stop()
        self.start(timeout)

    def cleanup(self) -> None:
        """Stop the server and remove its directory (data, socket, log)."""
        self.stop()
        shutil.rmtree(self.directory, ignore_errors=True)


def main(argv: Iterable[str] | None = None) -> int:
    return ARCHIVE.command("python -m testbed.servers.postgres_server", argv)


if __name__ == "__main__":
    sys.exit(main())
