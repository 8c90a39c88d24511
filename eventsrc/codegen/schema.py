"""Generate ``schemas/events.schema.json`` from the event Structs (one command, no hand edits).

    python -m eventsrc.codegen.schema --write     # regenerate the file
    python -m eventsrc.codegen.schema --check     # exit 1 if the file and the code differ

The file is JSON Schema (2020-12) for one record as ``eventsrc log -o json`` prints it;
each event type carries ``x-eventsrc-version``, the version this code writes.
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
from pathlib import Path
from typing import Any

import msgspec

from eventsrc.events import EVENT_TYPES

SCHEMA_PATH = Path(__file__).resolve().parents[2] / "schemas" / "events.schema.json"


def generate() -> str:
    types = list(EVENT_TYPES.values())
    refs, defs = msgspec.json.schema_components(types, ref_template="#/$defs/{name}")
    for d in defs.values():
        # The docstring's indentation taken out here, as msgspec 0.23 does and 0.22 did not:
        # the file is the same whichever one generates it.
        if "description" in d:
            d["description"] = inspect.cleandoc(d["description"])
    for name, cls in EVENT_TYPES.items():
        defs[name]["x-eventsrc-version"] = cls.VERSION
    # The record's "type" names the schema its "event" follows.
    by_type = [
        {"if": {"properties": {"type": {"const": cls.__name__}}}, "then": {"properties": {"event": ref}}}
        for cls, ref in zip(types, refs, strict=True)
    ]
    schema: dict[str, Any] = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://eventsrc.dev/schemas/events.schema.json",
        "title": "eventsrc record",
        "description": "One record of the eventsrc log as `eventsrc log -o json` prints it. On disk the "
        "record is msgpack: CRC32 then [type, version, ts_ns, correlation_id, event]; "
        "the key is the big-endian u64 sequence number.",
        "type": "object",
        "required": ["seq", "ts_ns", "correlation_id", "type", "version", "event"],
        "properties": {
            "seq": {"type": "integer", "minimum": 1, "description": "global sequence number, given by the log"},
            "ts_ns": {"type": "integer", "description": "wall-clock time of the append, ns since the epoch"},
            "time": {"type": "string", "description": "ts_ns as RFC 3339 UTC"},
            "correlation_id": {"type": "string", "description": "shared by every event one request caused"},
            "type": {"type": "string", "enum": sorted(EVENT_TYPES)},
            "version": {"type": "integer", "minimum": 1, "description": "the event type's schema version"},
            "event": {"type": "object"},
        },
        "allOf": by_type,
        "$defs": dict(sorted(defs.items())),
    }
    return json.dumps(schema, indent=2, sort_keys=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m eventsrc.codegen.schema", description=__doc__.split("\n\n")[0])
    g = p.add_mutually_exclusive_group()
    g.add_argument("--write", action="store_true", help=f"write {SCHEMA_PATH}")
    g.add_argument("--check", action="store_true", help="exit 1 when the file differs from the code")
    args = p.parse_args(argv)
    text = generate()
    if args.write:
        SCHEMA_PATH.write_text(text)
        print(f"wrote {SCHEMA_PATH}")
    elif args.check:
        current = SCHEMA_PATH.read_text() if SCHEMA_PATH.exists() else ""
        if current != text:
            print(f"{SCHEMA_PATH} is stale: run 'python -m eventsrc.codegen.schema --write'", file=sys.stderr)
            return 1
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
