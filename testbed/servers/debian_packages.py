"""Debian packages a harness runs (containerd for ``eventsrc bench nri`` and the tests; nats-server
and PostgreSQL for the tests), fetched into a cache without installing anything system-wide.

``fetch(cache, packages, ...)`` downloads ``packages`` ((name, suite) pairs) with ``apt-get
download`` through a private apt configuration (its own source list, lists and cache directories
under ``cache``; nothing of the system's apt configuration) and unpacks them with ``dpkg -x`` under
``cache/root``. A stamp records the versions once the unpacked files are complete and checked;
later calls reuse it without network. Processes running at once (pytest-xdist) share the cache:
one fetches under a lock, the others wait for it and reuse what it fetched.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from eventsrc.errors import EventsrcError

KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"
MIRROR = "http://deb.debian.org/debian"
STAMP_NAME = "complete.json"

Progress = Callable[[str], None]


class FetchError(EventsrcError):
    """The packages could not be fetched; ``str()`` is one line."""


@dataclass(frozen=True)
class Unpacked:
    """A complete cache: the packages unpacked under ``root``, and their versions."""

    cache: Path
    versions: dict[str, str]

    @property
    def root(self) -> Path:
        return self.cache / "root"

    def required(self) -> list[Path]:
        """What must be there for the cache to be complete (a subclass names its files)."""
        return []


U = TypeVar("U", bound=Unpacked)


def one_line(text: str) -> str:
    """The line of a tool's output that says what went wrong (its last error, else its last line)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith(("E:", "Err:", "error", "Error", "fatal", "FATAL"))]
    warnings = [line for line in lines if line.startswith("W:")]
    return (errors or warnings or lines or ["no output"])[-1][:300]


def run(
    cmd: Sequence[str | os.PathLike[str]],
    what: str,
    *,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 600,
    **popen: Any,
) -> str:
    """``cmd``'s stdout; ``FetchError`` (one line) when it cannot run, times out or fails.
    ``popen`` are more of subprocess's arguments (``user``, ``group``)."""
    argv = [str(c) for c in cmd]
    try:
        proc: subprocess.CompletedProcess[str] = subprocess.run(
            argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, **popen
        )
    except FileNotFoundError as e:
        raise FetchError(f"{what}: {e.filename} not found") from e
    except PermissionError as e:
        raise FetchError(f"{what}: {e.strerror}") from e
    except subprocess.TimeoutExpired as e:
        raise FetchError(f"{what}: no answer in {timeout:g} s") from e
    if proc.returncode != 0:
        raise FetchError(f"{what} exited {proc.returncode}: {one_line(proc.stderr + proc.stdout)}")
    return proc.stdout


def cached(cache: Path, version: int, required: Callable[[Unpacked], Iterable[Path]]) -> Unpacked | None:
    """The cache when it is complete (stamped with ``version``, every ``required`` path there)."""
    try:
        stamp = json.loads((cache / STAMP_NAME).read_text())
    except (OSError, ValueError):
        return None
    if stamp.get("version") != version:
        return None
    unpacked = Unpacked(cache, dict(stamp.get("packages", {})))
    return unpacked if all(p.exists() for p in required(unpacked)) else None


def fetch(
    cache: Path,
    packages: Sequence[tuple[str, str]],
    *,
    version: int,
    required: Callable[[Unpacked], Iterable[Path]],
    finish: Callable[[Unpacked, Progress], None] = lambda _unpacked, _progress: None,
    progress: Progress = lambda _: None,
) -> Unpacked:
    """``packages`` unpacked in ``cache``: reused when complete (no network), else fetched.

    ``finish`` checks what was unpacked (runs a binary's ``--version``) or adds to it, before
    the stamp (``version``) is written. Raises ``FetchError`` (one line) when apt, dpkg or
    ``finish`` fail."""
    if (done := cached(cache, version, required)) is not None:
        progress(f"cached in {cache}: " + ", ".join(f"{k} {v}" for k, v in done.versions.items()))
        return done
    try:
        cache.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise FetchError(f"cannot create the cache {cache}: {e.strerror}") from e
    with open(cache / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another test process may be fetching into the same cache
        if (done := cached(cache, version, required)) is not None:
            return done
        return _fetch_locked(cache, packages, version, finish, progress)


def _apt_options(cache: Path) -> list[str]:
    options = {
        "Dir::Etc::SourceList": cache / "sources.list",
        "Dir::Etc::SourceParts": "/dev/null",
        # Nothing of the system's apt configuration: no preferences, no apt.conf.d (its update hooks).
        "Dir::Etc::Parts": "/dev/null",
        "Dir::Etc::Preferences": "/dev/null",
        "Dir::Etc::PreferencesParts": "/dev/null",
        "Dir::State::Lists": cache / "lists",
        "Dir::Cache": cache / "aptcache",
        "APT::Sandbox::User": "root",
        "Acquire::Languages": "none",
    }
    return [arg for key, value in options.items() for arg in ("-o", f"{key}={value}")]


def _fetch_locked(
    cache: Path,
    packages: Sequence[tuple[str, str]],
    version: int,
    finish: Callable[[Unpacked, Progress], None],
    progress: Progress,
) -> Unpacked:
    (cache / STAMP_NAME).unlink(missing_ok=True)
    suites = sorted({suite for _, suite in packages})
    (cache / "sources.list").write_text(
        "".join(f"deb [signed-by={KEYRING}] {MIRROR} {suite} main\n" for suite in suites)
    )
    for sub in ("lists/partial", "aptcache/archives/partial"):
        (cache / sub).mkdir(parents=True, exist_ok=True)
    apt = ["apt-get", "-q", *_apt_options(cache)]
    progress(f"apt-get update ({', '.join(suites)} from {MIRROR}) into {cache}")
    run([*apt, "update"], "apt-get update")
    debs = cache / "debs"
    shutil.rmtree(debs, ignore_errors=True)
    debs.mkdir()
    wanted = [f"{name}/{suite}" for name, suite in packages]
    progress("apt-get download " + " ".join(wanted))
    run([*apt, "download", *wanted], "apt-get download", cwd=debs)
    root = cache / "root"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir()
    versions: dict[str, str] = {}
    for deb in sorted(debs.glob("*.deb")):
        name = run(["dpkg-deb", "-f", deb, "Package"], f"dpkg-deb -f {deb.name}").strip()
        versions[name] = run(["dpkg-deb", "-f", deb, "Version"], f"dpkg-deb -f {deb.name}").strip()
        progress(f"dpkg -x {deb.name}")
        run(["dpkg", "-x", deb, root], f"dpkg -x {deb.name}")
    missing = [name for name, _ in packages if name not in versions]
    if missing:
        raise FetchError(f"apt-get download gave no {', '.join(missing)}")
    unpacked = Unpacked(cache, versions)
    finish(unpacked, progress)
    shutil.rmtree(debs, ignore_errors=True)  # unpacked under root/
    (cache / STAMP_NAME).write_text(json.dumps({"version": version, "packages": versions}, indent=1))
    progress("fetched: " + ", ".join(f"{k} {v}" for k, v in versions.items()))
    return unpacked


class Packages(Generic[U]):
    """The Debian packages a harness runs (``kind`` says where their files are and which must be
    there), the cache they are fetched into, and ``finish``: what checks them (or adds to them)
    before the cache is stamped complete."""

    def __init__(
        self,
        kind: type[U],
        packages: Sequence[tuple[str, str]],
        *,
        version: int,
        default_cache: Path,
        cache_env: str,
        finish: Callable[[U, Progress], None] = lambda _unpacked, _progress: None,
    ) -> None:
        self.kind = kind
        self.packages = tuple(packages)
        self.version = version
        self.default_cache = default_cache
        self.cache_env = cache_env
        self.finish = finish
        self._outcomes: dict[Path, U | str] = {}

    def cache_dir(self) -> Path:
        return Path(os.environ.get(self.cache_env) or self.default_cache)

    def _as_kind(self, unpacked: Unpacked) -> U:
        return self.kind(unpacked.cache, unpacked.versions)

    def cached(self, cache: Path | None = None) -> U | None:
        """The packages when the cache is complete (no network), else None."""
        unpacked = cached(
            Path(cache) if cache is not None else self.cache_dir(),
            self.version,
            lambda u: self._as_kind(u).required(),
        )
        return None if unpacked is None else self._as_kind(unpacked)

    def fetch(self, cache: Path | None = None, progress: Progress = lambda _: None) -> U:
        """The unpacked packages in ``cache`` (default the cache directory): reused when complete
        (no network), else fetched. Raises ``FetchError`` (one line)."""
        unpacked = fetch(
            Path(cache) if cache is not None else self.cache_dir(),
            self.packages,
            version=self.version,
            required=lambda u: self._as_kind(u).required(),
            finish=lambda u, p: self.finish(self._as_kind(u), p),
            progress=progress,
        )
        return self._as_kind(unpacked)

    def fetched_or_error(self, cache: Path | None = None) -> U | str:
        """``fetch()`` at most once per process and cache directory: what it gave, or the one-line
        reason it failed (so that a fixture can skip with it)."""
        cache = Path(cache) if cache is not None else self.cache_dir()
        if cache not in self._outcomes:
            try:
                self._outcomes[cache] = self.fetch(cache)
            except FetchError as e:
                self._outcomes[cache] = str(e)
            except OSError as e:
                self._outcomes[cache] = f"{type(e).__name__}: {e}"
        return self._outcomes[cache]

    def fetched(self) -> U:
        """``fetched_or_error()`` of the cache directory; ``FetchError`` with its reason."""
        outcome = self.fetched_or_error()
        if isinstance(outcome, str):
            raise FetchError(outcome)
        return outcome

    def command(self, prog: str, argv: Iterable[str] | None = None) -> int:
        """``<prog> fetch [--cache DIR]`` (``prog`` such as ``python -m tests.support.nats``): fill the
        cache ahead of the harness's first use; 0, or 1 with the one-line reason on stderr."""
        names = ", ".join(name for name, _ in self.packages)
        parser = argparse.ArgumentParser(prog=prog)
        sub = parser.add_subparsers(dest="command", required=True)
        fetch_cmd = sub.add_parser("fetch", help=f"fetch {names} into the cache (reused when complete)")
        fetch_cmd.add_argument(
            "--cache",
            type=Path,
            default=None,
            help=f"cache directory (default ${self.cache_env} or {self.default_cache})",
        )
        args = parser.parse_args(list(argv) if argv is not None else None)
        started = time.monotonic()
        try:
            unpacked = self.fetch(args.cache, lambda line: print(line, flush=True))
        except (FetchError, OSError) as e:
            print(f"fetch failed: {e}", file=sys.stderr)
            return 1
        print(f"ready in {time.monotonic() - started:.1f} s: {unpacked.cache}")
        return 0
