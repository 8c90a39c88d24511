"""Errors a user can see. Each renders as one clear line; the CLI prints it without a traceback."""

from __future__ import annotations


def first_line(exc: BaseException) -> str:
    """The first line of what ``exc`` says (its type's name when it says nothing): what a log
    line or a one-line error gives of a failure from outside."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


class EventsrcError(Exception):
    """Base of every expected error. ``str(err)`` is the whole message."""

    exit_code = 1


class NoLogError(EventsrcError):
    pass


class AlreadyRunningError(EventsrcError):
    pass


class ConcurrencyConflictError(EventsrcError):
    """An append expected a last sequence the log no longer has."""

    def __init__(self, expected: int, actual: int) -> None:
        super().__init__(f"append expected last sequence {expected}, but the log is at {actual}")
        self.expected = expected
        self.actual = actual


class LogClosedError(EventsrcError):
    pass


class NewerLogError(EventsrcError):
    """The log holds what only a newer eventsrc understands (docs/adr/0010): writing on it
    could contradict what that version recorded. Its own exit status, so that a service
    manager can tell it from a crash and not restart in a loop."""

    exit_code = 3


class LogCutWhileReadingError(EventsrcError):
    """A retention cut moved the live log's start past a record a strict reader was about
    to read (docs/adr/0018): the records it wanted are in the archive now."""

    def __init__(self, next_seq: int, base_seq: int) -> None:
        super().__init__(
            f"the daemon cut the live log while it was read: records {next_seq}..{base_seq} left for the "
            "archive meanwhile; run the command again"
        )
        self.next_seq = next_seq
        self.base_seq = base_seq


class RecordsCutError(EventsrcError):
    """Records a follower had not read yet left the live log (a retention cut, docs/adr/0018)
    and cannot be read from the archive here: it stops at the first of them rather than
    skip them."""

    def __init__(self, first: int, last: int, why: str) -> None:
        super().__init__(
            f"records {first}..{last} left the live log before they were read, and {why}: stopped before record {first}"
        )
        self.first = first
        self.last = last


class DamagedLogError(EventsrcError):
    """The log's files are damaged or gone in a way no start can repair: a truncated
    ``data.mdb``, one that is not LMDB, a log lost next to the history that proves it
    existed (docs/adr/0005). Its own exit status, so that a service manager does not
    restart into a loop: an operator has to look."""

    exit_code = 4


class AdmissionRefused(EventsrcError):
    """The pod cannot be admitted (or removed now); the message is the reason."""


class BadRequest(EventsrcError):
    """A request the daemon cannot read (a field missing or malformed); the message names it."""

    exit_code = 2


class NotFound(EventsrcError):
    """No such pod."""
