"""The fleet's names for a node's records on NATS JetStream (issue 28): pure, no I/O.

A node's log is shipped record by record, in sequence order, to one JetStream stream. Each
record is one message:

    subject   <prefix>.<node>.<log id>        the node name with "." as "_" (a NATS token
                                              cannot hold "."; a node name cannot hold "_")
    headers   Nats-Msg-Id    <node>:<log id>:<seq>   JetStream stores a message id once
                                              within the stream's duplicate window
              Eventsrc-Node, Eventsrc-Log, Eventsrc-Seq, Eventsrc-Type, and
              Eventsrc-Follows: the record shipped before it (seq - 1, unless a
              retention cut took records before they were shipped: the sink goes on
              from there instead of waiting for them)
    payload   the record's bytes as the log holds them (CRC32, then the envelope): the sink
              checks and decodes them as the log does (``events.decode_record``)

A node is its node name and the identity of its log (``EventLog.log_id``): two logs under
one name (a node whose log was lost and started again) are two subjects, never interleaved.
Shipping resumes from what the stream holds: the last message on the node's subject names
the last sequence acknowledged (``acknowledged``), never a local cursor alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from eventsrc.core.devices.names import is_dns1123_subdomain

DEFAULT_STREAM: Final = "EVENTSRC"
DEFAULT_PREFIX: Final = "eventsrc.records"
#: JetStream's duplicate window the stream is created with: a publish retried after a lost
#: acknowledgement within it is stored once (a resume asks the stream, so older ones are not sent)
DUPLICATE_WINDOW_S: Final = 600.0

MSG_ID: Final = "Nats-Msg-Id"
NODE: Final = "Eventsrc-Node"
LOG: Final = "Eventsrc-Log"
SEQ: Final = "Eventsrc-Seq"
TYPE: Final = "Eventsrc-Type"
FOLLOWS: Final = "Eventsrc-Follows"


def node_name_error(name: str) -> str:
    """Why ``name`` cannot name a node in the fleet ("" when it can): a Kubernetes node name,
    a DNS-1123 subdomain (at most 253 characters: lowercase letters, digits, "-" and ".")."""
    if is_dns1123_subdomain(name):
        return ""
    return (
        f"node name {name!r} is not a DNS-1123 subdomain (lowercase letters, digits, '-' and '.', "
        "at most 253 characters), as a Kubernetes node name is"
    )


@dataclass(frozen=True)
class Node:
    """One node's log in the fleet: its node name and its log's identity."""

    name: str
    log_id: str

    def subject(self, prefix: str = DEFAULT_PREFIX) -> str:
        return f"{prefix}.{self.name.replace('.', '_')}.{self.log_id}"

    def msg_id(self, seq: int, value_hash: bytes = b"") -> str:
        """JetStream's id for the record: with the record's own hash (``events.chain_hash`` of its
        stored value), so that nobody who has not seen the record can take its id first and have
        the node's real record dropped as a duplicate (issue 34, ADR 0034)."""
        own = f":{value_hash.hex()}" if value_hash else ""
        return f"{self.name}:{self.log_id}:{seq}{own}"

    def headers(self, seq: int, type_name: str, follows: int | None = None, value_hash: bytes = b"") -> dict[str, str]:
        """``follows``: the sequence of the record shipped before it on this subject (``seq - 1``
        but after records a retention cut took before they were shipped; 0 for the first).
        ``value_hash``: the record's ``chain_hash``, in its message id."""
        out = {MSG_ID: self.msg_id(seq, value_hash), NODE: self.name, LOG: self.log_id, SEQ: str(seq), TYPE: type_name}
        out[FOLLOWS] = str(seq - 1 if follows is None else follows)
        return out


def acknowledged(node: Node, last: Mapping[str, str] | None) -> int:
    """The last sequence of ``node`` the stream holds, from the headers of the last message on
    its subject (None: none there): 0 when it holds none. A last message that is not this
    node's log (its headers say otherwise) is refused: the subject is another's."""
    if last is None:
        return 0
    if (last.get(NODE), last.get(LOG)) != (node.name, node.log_id):
        raise ValueError(
            f"the last message on {node.subject()} is of node {last.get(NODE)!r}, log {last.get(LOG)!r}, "
            f"not {node.name!r}, {node.log_id!r}"
        )
    seq = last.get(SEQ, "")
    if not seq.isdigit():
        raise ValueError(f"the last message on {node.subject()} has no sequence ({SEQ}: {seq!r})")
    return int(seq)


def stream_subjects(prefix: str = DEFAULT_PREFIX) -> list[str]:
    """The subjects the stream takes: every node's records."""
    return [f"{prefix}.>"]


@dataclass(frozen=True)
class Shipped:
    """What a message's headers say it is: a record of ``node``'s log."""

    node: Node
    seq: int
    follows: int


def shipped(headers: Mapping[str, str]) -> Shipped | None:
    """The record a message's headers name, or None when they name none (not a shipper's)."""
    name, log_id, seq, follows = (headers.get(k, "") for k in (NODE, LOG, SEQ, FOLLOWS))
    if node_name_error(name) or not log_id or not seq.isdigit() or not follows.isdigit() or int(follows) >= int(seq):
        return None
    return Shipped(Node(name, log_id), int(seq), int(follows))
