"""What a fleet sink takes as a node's record (``core.shipped_records``) and what a node's resume
makes of its subject on the stream (``core.shipping.judge``): pure tables (issue 34)."""

from __future__ import annotations

import pytest

from eventsrc import events as ev
from eventsrc.core.fleet_names import FOLLOWS, LOG, NODE, SEQ, TYPE, Node
from eventsrc.core.shipped_records import (
    CONFLICT,
    HEADERS,
    LINK,
    PAYLOAD,
    SUBJECT,
    TYPE_MISMATCH,
    Candidate,
    Refusal,
    Stored,
    check_message,
    settle,
)
from eventsrc.core.shipping import Seen, judge
from eventsrc.events import chain_hash, encode_payload, prev_hash_of

NODE_A = Node("node-a", "0f1e2d3c4b5a69788796a5b4c3d2e1f0")
PREFIX = "eventsrc.records"


def chain(n: int, start: bytes = b"") -> list[bytes]:
    """``n`` records of one log, each linked to the one before."""
    out, link = [], start
    for i in range(1, n + 1):
        value = encode_payload(ev.PodRemoved(pod_uid=f"u{i}"), 1000 + i, f"c{i}", link)
        out.append(value)
        link = chain_hash(value)
    return out


LOG_VALUES = chain(5)


def message(seq: int, value: bytes, **override: str) -> tuple[str, dict[str, str], bytes]:
    headers = NODE_A.headers(seq, "PodRemoved", value_hash=chain_hash(value))
    subject = override.pop("subject", NODE_A.subject(PREFIX))
    headers.update(override)
    return subject, headers, value


def kind(subject: str, headers: dict[str, str], data: bytes) -> str:
    got = check_message(subject, headers, data, PREFIX)
    return got.kind if isinstance(got, Refusal) else "candidate"


@pytest.mark.parametrize(
    ("override", "data", "want"),
    [
        ({}, LOG_VALUES[1], "candidate"),
        ({SEQ: "99999999999999999999"}, LOG_VALUES[1], HEADERS),  # beyond a bigint
        ({SEQ: "9223372036854775808"}, LOG_VALUES[1], HEADERS),  # one past the largest bigint
        ({SEQ: "0"}, LOG_VALUES[1], HEADERS),
        ({SEQ: "-1"}, LOG_VALUES[1], HEADERS),
        ({SEQ: "٣"}, LOG_VALUES[1], HEADERS),  # a digit, not ASCII
        ({FOLLOWS: "2"}, LOG_VALUES[1], HEADERS),  # follows itself
        ({NODE: "Node_A"}, LOG_VALUES[1], HEADERS),
        ({NODE: "node-b"}, LOG_VALUES[1], SUBJECT),  # the subject is node-a's
        ({LOG: "a.b"}, LOG_VALUES[1], HEADERS),
        ({LOG: "x" * 65}, LOG_VALUES[1], HEADERS),
        ({"subject": "eventsrc.records.node-a.other"}, LOG_VALUES[1], SUBJECT),
        ({}, b"hello", PAYLOAD),
        ({TYPE: "PodAdmitted"}, LOG_VALUES[1], TYPE_MISMATCH),
        ({TYPE: ""}, b"hello", "candidate"),  # a node ships its damaged record with no type: it waits
    ],
)
def test_one_message_alone(override: dict[str, str], data: bytes, want: str) -> None:
    assert kind(*message(2, data, **override)) == want


def candidate(seq: int, value: bytes, follows: int | None = None) -> Candidate:
    got = check_message(*message(seq, value, **({FOLLOWS: str(follows)} if follows is not None else {})), PREFIX)
    assert isinstance(got, Candidate), got
    return got


def stored(*seqs: int, values: list[bytes] = LOG_VALUES) -> dict[int, Stored]:
    return {s: Stored(chain_hash(values[s - 1]), prev_hash_of(values[s - 1])) for s in seqs}


def forged(seq: int) -> bytes:
    return encode_payload(ev.PodRemoved(pod_uid="evil"), 1, "", b"f" * 16)


def test_a_record_that_links_is_stored_and_one_that_does_not_is_refused() -> None:
    d = settle([candidate(3, forged(3)), candidate(3, LOG_VALUES[2])], stored(2))
    assert [c.data for c in d.store] == [LOG_VALUES[2]]
    assert [r.kind for _, r in d.refuse] == [LINK]


def test_a_record_ahead_of_a_gap_waits_until_its_predecessor_comes() -> None:
    four = candidate(4, LOG_VALUES[3])
    assert settle([four], stored(2)).wait == [four]
    d = settle([four, candidate(3, LOG_VALUES[2])], stored(2))
    assert [c.seq for c in d.store] == [3, 4] and not d.wait and not d.refuse


def test_a_second_record_under_a_stored_sequence_is_a_conflict_and_the_same_one_changes_nothing() -> None:
    twin = encode_payload(ev.PodRemoved(pod_uid="twin"), 7, "", chain_hash(LOG_VALUES[1]))  # linked, another
    d = settle([candidate(3, twin), candidate(3, LOG_VALUES[2])], stored(2, 3))
    assert [r.kind for _, r in d.refuse] == [CONFLICT] and [c.data for c in d.same] == [LOG_VALUES[2]]


def test_the_first_record_and_a_record_after_a_cut() -> None:
    assert [c.seq for c in settle([candidate(1, LOG_VALUES[0], 0)], {}, empty=True).store] == [1]
    # after records a cut took: its link cannot be checked, it names the one before it shipped
    assert [c.seq for c in settle([candidate(4, LOG_VALUES[3], 0)], {}, empty=True).store] == [4]
    assert [r.kind for _, r in settle([candidate(4, LOG_VALUES[3], 0)], stored(1), empty=False).refuse] == [LINK]
    assert settle([candidate(5, LOG_VALUES[4], 2)], stored(1)).wait  # it waits for the one it names
    assert [c.seq for c in settle([candidate(5, LOG_VALUES[4], 2)], stored(2)).store] == [5]
    linked_first = encode_payload(ev.PodRemoved(pod_uid="x"), 1, "", b"l" * 16)
    assert [r.kind for _, r in settle([candidate(1, linked_first, 0)], {}, empty=True).refuse] == [LINK]


def test_a_cut_that_the_stored_records_refute_is_refused() -> None:
    """A record that says the records before it were never shipped (a retention cut) cannot have
    its link checked; but when the node's records inside that gap are stored, the cut is false."""
    claims = candidate(4, forged(4), 1)  # "records 2-3 were never shipped"
    d = settle([claims], stored(1, 2, 3))
    assert [r.kind for _, r in d.refuse] == [LINK] and not d.store
    assert "records 2-3 were never shipped" in d.refuse[0][1].reason
    # the gap stored in the same batch, before it in sequence order: refuted too
    d = settle([claims, candidate(2, LOG_VALUES[1]), candidate(3, LOG_VALUES[2])], stored(1))
    assert [c.seq for c in d.store] == [2, 3] and [r.kind for _, r in d.refuse] == [LINK]
    # nothing stored inside the gap: a cut as the node ships one
    assert [c.seq for c in settle([claims], stored(1)).store] == [4]


def test_records_from_before_the_chain_link_to_records_from_before_the_chain() -> None:
    old = [encode_payload(ev.PodRemoved(pod_uid=f"o{i}"), i, "") for i in (1, 2)]
    assert [c.seq for c in settle([candidate(2, old[1])], stored(1, values=old)).store] == [2]
    assert [r.kind for _, r in settle([candidate(3, old[1])], stored(2)).refuse] == [LINK]


def test_a_damaged_record_is_refused_until_the_next_record_vouches_for_it() -> None:
    damaged = b"\0\0\0\0" + LOG_VALUES[2][4:]  # the node's own record 3, its checksum broken
    values = [*LOG_VALUES[:2], damaged, encode_payload(ev.PodRemoved(pod_uid="u4"), 1004, "c4", chain_hash(damaged))]
    three = check_message(*message(3, damaged, **{TYPE: ""}), PREFIX)
    assert isinstance(three, Candidate) and three.corrupt
    alone = settle([three], stored(2, values=values))
    assert [r.kind for _, r in alone.refuse] == [PAYLOAD] and not alone.store
    four = candidate(4, values[3])
    later = settle([four], stored(2, values=values), quarantined=[three])
    assert [c.seq for c in later.store] == [3, 4] and later.vouched == [three]
    # vouched only in its place: after the node's stored record 2, not ahead of a gap
    assert settle([four], stored(1, values=values), quarantined=[three]).wait == [four]
    assert not settle([four, three], stored(1, values=values)).store
    garbage = check_message(*message(3, b"\0\0\0\0garbage", **{TYPE: ""}), PREFIX)
    assert isinstance(garbage, Candidate)
    assert settle([four], stored(2, values=values), quarantined=[garbage]).wait == [four]


def seen(seq: int | None, data: bytes, log: list[bytes]) -> Seen:
    ours = log[seq - 1] if seq is not None and seq <= len(log) else None
    before = log[seq - 2] if seq is not None and 1 < seq <= len(log) + 1 else None
    return Seen(seq, data, ours, before)


def test_a_resume_tells_a_forgery_from_a_fork() -> None:
    log = LOG_VALUES[:4]
    assert judge([seen(4, log[3], log)], 4, False).stream_last == 4  # the log's own: go on from it
    # forgeries after the log's own record 3: no record, no link; the log's own go after them
    walk = [seen(4, forged(4), log), seen(4, b"hello", log), seen(3, log[2], log)]
    r = judge(walk, 4, False)
    assert (r.stream_last, r.diverged) == (3, "") and "does not link" in r.forged
    r = judge([seen(None, b"x", log), seen(3, log[2], log)], 4, False)
    assert r.stream_last == 3 and "headers" in r.forged
    # a fork: the stream's record links to the log's own and differs (a log restored behind it)
    other = chain(5)  # the same first records, then the stream's own
    fork = [*other[:3], encode_payload(ev.PodRemoved(pod_uid="fork"), 9, "", chain_hash(other[2]))]
    restored = other[:3]
    r = judge([seen(4, fork[3], restored), seen(3, other[2], restored)], 3, False)
    assert "past the log's end" in r.diverged
    # only forgeries and the subject's first reached: everything is sent again
    r = judge([seen(2, b"hello", log)], 4, True)
    assert (r.stream_last, r.diverged) == (0, "") and r.forged


def test_another_log_under_the_name_is_said_only_when_it_wrote_after_this_one_began() -> None:
    from eventsrc.core.shipping import namesakes, record_time

    assert namesakes("n", 100, [("old", 99)]) == ""  # a log lost and started again: it stopped first
    assert "('new')" not in namesakes("n", 100, [("new", 101)]) and "new" in namesakes("n", 100, [("new", 101)])
    assert namesakes("n", 0, [("new", 101)]) == ""  # this log has no record yet
    assert record_time({SEQ: "2"}, LOG_VALUES[1]) == 1002 and record_time({SEQ: "2"}, b"junk") == 0
    assert record_time({SEQ: "99999999999999999999"}, LOG_VALUES[1]) == 0
