"""What `serve` says when its daemon stops on errors (``cli.serve.worded_error``): one line
for errors eventsrc words, a traceback for anything else."""

from __future__ import annotations

from eventsrc.cli.serve import worded_error
from eventsrc.errors import EventsrcError
from eventsrc.log.commit import ViewsAheadError


def test_an_error_eventsrc_words_is_one_line_even_nested() -> None:
    """A damaged log that refuses the start's first append stops the daemon from inside its
    nurseries (found by tests/e2e/test_fuzz_damage.py): its one line, not the group."""
    refused = EventsrcError("cannot append to the event log at /r/eventsrc/log: MDB_CORRUPTED")
    group = BaseExceptionGroup("outer", [BaseExceptionGroup("inner", [refused])])
    assert worded_error(group) is refused


def test_the_views_ahead_of_the_log_come_first() -> None:
    ahead = ViewsAheadError("the log failed under the views")
    group = BaseExceptionGroup("g", [EventsrcError("other"), BaseExceptionGroup("h", [ahead])])
    assert worded_error(group) is ahead


def test_anything_else_is_left_to_be_seen_whole() -> None:
    assert worded_error(BaseExceptionGroup("g", [EventsrcError("worded"), KeyError("a bug")])) is None
    assert worded_error(BaseExceptionGroup("g", [RuntimeError("a bug")])) is None
