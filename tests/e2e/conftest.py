from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.containerd import Containerd, why_unavailable


@pytest.fixture(scope="session")
def containerd_unavailable() -> str | None:
    """Why a real containerd cannot run here (one line), or None; fetches it once per session
    (a no-op, without network, once the cache is complete)."""
    return why_unavailable()


@pytest.fixture
def containerd_runtime(containerd_unavailable: str | None, tmp_path: Path) -> Iterator[Containerd]:
    """A started containerd of its own (with NRI on ``.nri_socket`` and CDI specs read from
    ``.cdi_dir``); its pods, shims and cgroups are removed afterwards whatever the test did."""
    if containerd_unavailable is not None:
        pytest.skip(containerd_unavailable)
    runtime = Containerd(tmp_path / "containerd", cdi_dir=tmp_path / "cdi")
    try:
        runtime.start()
        yield runtime
    finally:
        runtime.stop()
