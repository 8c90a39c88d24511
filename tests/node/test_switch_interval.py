"""While the daemon serves, another thread running Python gives the GIL back to the loop's
thread within ``SWITCH_INTERVAL`` instead of CPython's 5 ms (docs/adr/0024); the
interpreter's own setting comes back when it stops."""

from __future__ import annotations

import sys
from functools import partial
from pathlib import Path

import trio

from eventsrc.layout import Layout
from eventsrc.node.daemon import SWITCH_INTERVAL, serve


async def test_the_daemon_shortens_the_switch_interval_while_it_serves(root: Path) -> None:
    before = sys.getswitchinterval()
    assert before > SWITCH_INTERVAL  # CPython's default, 5 ms
    async with trio.open_nursery() as nursery:
        await nursery.start(partial(serve, Layout(root)))
        assert sys.getswitchinterval() == SWITCH_INTERVAL
        nursery.cancel_scope.cancel()
    assert sys.getswitchinterval() == before
