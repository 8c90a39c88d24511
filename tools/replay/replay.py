#!/usr/bin/env python3
"""Replay an eventsrc log, read-only: the views at a point (``--until SEQ|TIME``), every
event with its change (``--step``), or a check of the invariants (``--check``).

    tools/replay/replay.py PATH [--until SEQ|TIME] [--from SEQ] [--step] [--check] [-o table|json]

The same as ``eventsrc replay``; see ``eventsrc/offline/log_replay.py``.
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run from a checkout without installing: the package is two directories up.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))

from eventsrc.offline.log_replay import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
