"""The reducer type shared by the projection modules."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from eventsrc.state.views import Views

#: ``reducer(views, seq, event)``: changes only ``views``; never raises, never does I/O.
Reducer = Callable[[Views, int, Any], None]
Handlers = dict[type, Reducer]
