"""A secret read from a file (a password for the fleet's NATS servers): never from a flag's
value, which ``ps`` shows. The file is read as the kubelet's files should be: opened without
blocking, a regular file only (a FIFO, a device, a socket or a directory is refused), at most
``MAX_SECRET_BYTES``. Symlinks are followed: a Kubernetes Secret mounted as a volume is a
chain of them (``..data``). Whatever is wrong is one line (``SecretFileError``)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from eventsrc.errors import EventsrcError

#: a password or a token is tens of bytes; anything longer is not one
MAX_SECRET_BYTES = 4096


class SecretFileError(EventsrcError):
    """A secret's file that cannot be used; the message names the file and why."""


def read_secret(path: Path, what: str) -> str:
    """The secret in ``path``: its text, less one trailing line end (as ``echo`` or a
    Secret's ``stringData`` leaves it). ``what`` names it in the error (``--fleet-nats-password-file``)."""

    def refused(why: str) -> SecretFileError:
        return SecretFileError(f"{what} {path}: {why}")

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as exc:
        raise refused(exc.strerror or type(exc).__name__) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise refused("not a regular file")
        if st.st_size > MAX_SECRET_BYTES:
            raise refused(f"more than {MAX_SECRET_BYTES} bytes: not a secret")
        data = os.read(fd, MAX_SECRET_BYTES + 1)
    except OSError as exc:
        raise refused(exc.strerror or type(exc).__name__) from None
    finally:
        os.close(fd)
    if len(data) > MAX_SECRET_BYTES:
        raise refused(f"more than {MAX_SECRET_BYTES} bytes: not a secret")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise refused("not UTF-8 text") from None
    text = text.removesuffix("\n").removesuffix("\r")
    if not text:
        raise refused("empty")
    if any(c in text for c in "\n\r\0"):
        raise refused("more than one line")
    return text
