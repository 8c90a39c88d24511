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
