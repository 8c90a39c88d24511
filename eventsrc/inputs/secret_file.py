"""A secret read from a file (a password for the fleet's NATS servers): never from a flag's
value, which ``ps`` shows. The file is read as the kubelet's files are (``bounded_file``): opened
without blocking, a regular file only (a FIFO, a device, a socket or a directory is refused), at
most ``MAX_SECRET_BYTES``. Symlinks are followed: a Kubernetes Secret mounted as a volume is a
chain of them (``..data``). Whatever is wrong is one line (``SecretFileError``)."""

from __future__ import annotations

from pathlib import Path

from eventsrc.errors import EventsrcError
from eventsrc.inputs import bounded_file

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
        data = bounded_file.read_regular(path, MAX_SECRET_BYTES, follow_links=True)
    except bounded_file.FileRefused as exc:
        raise refused(f"more than {MAX_SECRET_BYTES} bytes: not a secret" if exc.too_big else str(exc)) from None
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
