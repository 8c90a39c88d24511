"""The fleet's names for a node's records (``eventsrc.core.fleet_names``): pure, no server."""

from __future__ import annotations

import pytest

from eventsrc.core.fleet_names import (
    FOLLOWS,
    LOG,
    MSG_ID,
    NODE,
    SEQ,
    TYPE,
    Node,
    acknowledged,
    node_name_error,
    stream_subjects,
)
from eventsrc.core.shipping import (
    CONNECTED,
    DISCONNECTED,
    DIVERGED,
    ShippingReport,
    divergence,
    resume_from,
    trouble,
)

NODE_A = Node("worker-1.example.com", "0f1e2d3c4b5a69788796a5b4c3d2e1f0")


def test_a_record_is_named_by_its_node_and_log_and_numbered_by_its_sequence() -> None:
    assert NODE_A.subject() == "eventsrc.records.worker-1_example_com.0f1e2d3c4b5a69788796a5b4c3d2e1f0"
    assert NODE_A.subject("fleet.x") == "fleet.x.worker-1_example_com.0f1e2d3c4b5a69788796a5b4c3d2e1f0"
    assert NODE_A.headers(42, "PodAdmitted") == {
        MSG_ID: "worker-1.example.com:0f1e2d3c4b5a69788796a5b4c3d2e1f0:42",
        NODE: "worker-1.example.com",
        LOG: "0f1e2d3c4b5a69788796a5b4c3d2e1f0",
        SEQ: "42",
        TYPE: "PodAdmitted",
        FOLLOWS: "41",
    }
    assert NODE_A.headers(42, "PodAdmitted", follows=17)[FOLLOWS] == "17"  # records cut before shipping
    assert all(s.startswith("eventsrc.records.") for s in [NODE_A.subject()])
    assert stream_subjects() == ["eventsrc.records.>"]


def test_two_logs_under_one_name_and_two_names_are_two_subjects_and_ids() -> None:
    other_log = Node(NODE_A.name, "ffff")
    dotted, dashed = Node("a.b", "1"), Node("a-b", "1")
    assert len({NODE_A.subject(), other_log.subject(), dotted.subject(), dashed.subject()}) == 4
    assert len({NODE_A.msg_id(1), other_log.msg_id(1), dotted.msg_id(1), dashed.msg_id(1)}) == 4


def test_shipping_resumes_from_what_the_stream_holds() -> None:
    assert acknowledged(NODE_A, None) == 0
    assert acknowledged(NODE_A, NODE_A.headers(1234, "DevicesAllocated")) == 1234
    with pytest.raises(ValueError, match="is of node 'other'"):
        acknowledged(NODE_A, Node("other", NODE_A.log_id).headers(7, "X"))
    with pytest.raises(ValueError, match="has no sequence"):
        acknowledged(NODE_A, {**NODE_A.headers(7, "X"), SEQ: "seven"})


@pytest.mark.parametrize(
    ("name", "ok"),
    [("worker-1", True), ("a.b.c", True), ("Worker", False), ("a_b", False), ("", False), ("x" * 254, False)],
)
def test_a_node_name_is_a_kubernetes_node_name(name: str, ok: bool) -> None:
    assert (node_name_error(name) == "") is ok


def test_a_resume_takes_the_lower_of_the_stream_and_what_was_acknowledged_without_a_gap() -> None:
    # the first connection of a run: a window before the stream's last again (the run before may
    # have ended inside a failed window), each a duplicate the stream drops unless a hole lacks it
    assert resume_from(40, None, 8) == 32
    assert resume_from(5, None, 8) == 0
    assert resume_from(40, 36, 8) == 36  # a publish inside the window failed, a later one was stored
    assert resume_from(40, 45, 8) == 40  # the stream lost acknowledged records (a failover): sent again


def test_the_stream_and_the_log_diverge_when_the_log_lacks_or_differs_from_the_streams_last() -> None:
    assert divergence(10, 12, b"r10", b"r10") == ""
    assert divergence(10, 12, b"r10", None) == ""  # cut without an archive: nothing to compare
    assert "record 10 of this log, past the log's end" in divergence(10, 5, b"r10", None)
    assert "differs from the log's" in divergence(10, 12, b"r10", b"another")


def test_shipping_says_its_lag_and_its_trouble() -> None:
    report = ShippingReport(state=CONNECTED, shipped_seq=7, last_seq=10, oldest_unshipped_ns=2_000_000_000)
    assert report.lag_records == 3 and report.lag_seconds(5_000_000_000) == 3.0
    caught_up = ShippingReport(state=CONNECTED, shipped_seq=10, last_seq=10, oldest_unshipped_ns=0)
    assert caught_up.lag_records == 0 and caught_up.lag_seconds(5_000_000_000) == 0.0
    assert trouble(CONNECTED, "", 3) == ""
    assert trouble(DISCONNECTED, "nats: no servers available", 3) == (
        "fleet shipping is disconnected (nats: no servers available); 3 records not shipped yet"
    )
    assert "diverged (why)" in trouble(DIVERGED, "why", 0)
