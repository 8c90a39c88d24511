"""A file from outside read without trusting it (issue 34): opened without blocking (a FIFO's
open would wait for a writer for ever), a regular file only (a FIFO, device, socket or directory
is refused unread), optionally no symbolic link as its last component, and read only up to a cap
(a file that grows while read is still bounded). The kubelet's checkpoint files, a secret's file
and the archive's segments are read through it."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

#: What says a file is unchanged since it was read: its device, inode, size, mtime and ctime (ns)
FileKey = tuple[int, int, int, int, int]

_KINDS = {
    stat.S_IFDIR: "a directory",
    stat.S_IFIFO: "a FIFO",
    stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFLNK: "a symbolic link",
}


class FileRefused(Exception):
    """Why a file is not read: the message does not name the file (the caller does).
    ``too_big``: it is over the cap."""

    def __init__(self, why: str, too_big: bool = False) -> None:
        super().__init__(why)
        self.too_big = too_big


def kind(mode: int) -> str:
    """What a file of ``mode`` is, as a refusal names it ("a FIFO")."""
    return _KINDS.get(stat.S_IFMT(mode), "a special file")


def open_regular(path: Path, cap: int | None, *, follow_links: bool = False) -> tuple[int, FileKey] | None:
    """``path`` opened for reading (a descriptor the caller closes, or gives to ``read_open``)
    and its key; None when it is not there. FileRefused when it is not a regular file of at most
    ``cap`` bytes (None: any size), or, without ``follow_links``, when it is a symbolic link."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY | (0 if follow_links else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP and not follow_links:
            raise FileRefused("is a symbolic link (not followed)") from None
        raise FileRefused(exc.strerror or type(exc).__name__) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise FileRefused(f"not a regular file ({kind(st.st_mode)})")
        if cap is not None and st.st_size > cap:
            raise FileRefused(f"{st.st_size} bytes, over the {cap}-byte cap", too_big=True)
    except BaseException:
        os.close(fd)
        raise
    return fd, (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def read_open(fd: int, cap: int) -> bytes:
    """At most ``cap`` bytes of the open file ``fd`` (closed here); FileRefused when it grew
    past the cap while it was read."""
    try:
        chunks, size = [], 0
        while size <= cap:
            chunk = os.read(fd, min(1 << 20, cap + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as exc:
        raise FileRefused(exc.strerror or type(exc).__name__) from None
    finally:
        os.close(fd)
    if size > cap:
        raise FileRefused(f"grew past the {cap}-byte cap while it was read", too_big=True)
    return b"".join(chunks)


def read_regular(path: Path, cap: int, *, follow_links: bool = False) -> bytes:
    """The whole of ``path``, read as above; FileRefused when it cannot be, or is not there."""
    opened = open_regular(path, cap, follow_links=follow_links)
    if opened is None:
        raise FileRefused(os.strerror(errno.ENOENT))
    return read_open(opened[0], cap)
