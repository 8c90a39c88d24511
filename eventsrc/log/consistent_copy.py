"""``eventsrc backup DEST``: a consistent copy of the state directory, safe while the daemon runs.

The log is copied by LMDB itself (``mdb_env_copy2``, as ``mdb_copy -c`` does) inside one
read transaction: the copy is the log exactly as it was at one commit, a prefix of the
history with its hash chain whole. A plain ``cp`` of ``data.mdb`` is not: the daemon
rewrites pages and the two meta pages while ``cp`` reads the file front to back, so the
copy can mix pages of different commits (see docs/operations.md).

Snapshots are a cache (ADR 0003): the ones at or before the copied sequence are copied
too, so that a start from the backup is quick; without them it replays the whole log.

After retention cuts (docs/adr/0018) the archive segments the copied log's ledger names are
copied too (after the log, so a cut meanwhile adds no segment the copy does not name). They
are sealed and never rewritten, so a plain copy of each is consistent; ``audit verify`` on
the backup checks them against the copied ledger. A segment the ledger names that is not
there is listed in ``BackupInfo.missing``.
"""

from __future__ import annotations

import contextlib
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import lmdb

from eventsrc.errors import EventsrcError
from eventsrc.layout import Layout
from eventsrc.log.snapshots import snapshot_files
from eventsrc.log.store import EventLog


@dataclass(frozen=True)
class BackupInfo:
    dest: Path
    last_seq: int
    log_bytes: int
    snapshots: list[Path]
    segments: list[Path] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)  # segments the ledger names, not found


def backup(layout: Layout, dest: Path) -> BackupInfo:
    """Copy ``layout``'s log (and usable snapshots) into ``dest``, laid out as a root directory,
    so that every read-only command works on it with ``--root-dir DEST``. ``dest`` must
    not exist or be empty; its parent must exist."""
    src = layout.require_log()
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise EventsrcError(f"backup destination {dest} must be a new or empty directory")
    if not dest.parent.is_dir():
        raise EventsrcError(f"backup destination {dest}: {dest.parent} does not exist")
    target = Layout(dest)
    try:
        for d in (dest, target.state, target.log):
            d.mkdir(mode=0o700, exist_ok=True)
    except OSError as exc:
        raise EventsrcError(f"cannot create {target.log}: {exc.strerror}") from None
    # Opened as a reader with LMDB's lock table, like any reader: the writer will not reuse
    # the pages the copy's read transaction still needs.
    with EventLog(src, readonly=True) as event_log:
        try:
            try:
                event_log.env.copy(str(target.log), compact=True)
            except lmdb.MapResizedError:  # the daemon grew the map: adopt its size, once
                event_log.env.set_mapsize(0)
                (target.log / "data.mdb").unlink(missing_ok=True)
                event_log.env.copy(str(target.log), compact=True)
        except lmdb.Error as exc:
            raise EventsrcError(f"cannot copy the event log to {target.log}: {exc}") from None
    with EventLog(target.log, readonly=True, lock=False) as copy:
        last = copy.last_seq()
        ledger = copy.ledger()
    segments, missing = _copy_segments(layout.archive, target.archive, [e.file for e in ledger if e.file])
    copied = []
    for snap in snapshot_files(layout.snapshots):
        # snapshot-<seq>.msgpack; one ahead of the copy would be ignored on start anyway.
        if int(snap.name.split("-")[1].split(".")[0]) <= last:
            target.snapshots.mkdir(mode=0o700, exist_ok=True)
            with contextlib.suppress(FileNotFoundError):  # pruned by the daemon meanwhile
                copied.append(Path(shutil.copy2(snap, target.snapshots / snap.name)))
    return BackupInfo(dest, last, (target.log / "data.mdb").stat().st_size, copied, segments, missing)


def _copy_segments(src: Path, dest: Path, names: list[str]) -> tuple[list[Path], list[str]]:
    """Copy the segments ``names`` from ``src`` into ``dest``: (copied, not found)."""
    copied: list[Path] = []
    missing: list[str] = []
    for name in names:
        if not (src / name).is_file():
            missing.append(name)
            continue
        try:
            dest.mkdir(mode=0o750, exist_ok=True)
            copied.append(Path(shutil.copy2(src / name, dest / name)))
        except OSError as exc:
            raise EventsrcError(f"cannot copy archive segment {src / name} to {dest}: {exc.strerror}") from None
    return copied, missing
