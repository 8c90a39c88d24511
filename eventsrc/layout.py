"""Where everything lives under ``--root-dir``: the kubelet's layout plus ``eventsrc/``."""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from eventsrc.errors import EventsrcError, NoLogError

DEFAULT_ROOT = Path("/var/lib/kubelet")
#: --root-dir's default beside a kubelet (``serve --beside-kubelet``): never inside the kubelet's
BESIDE_ROOT = Path("/var/lib/eventsrc")


@dataclass(frozen=True)
class Layout:
    root: Path

    @property
    def device_plugins(self) -> Path:
        return self.root / "device-plugins"

    @property
    def plugins_registry(self) -> Path:
        return self.root / "plugins_registry"

    @property
    def plugins(self) -> Path:
        return self.root / "plugins"

    @property
    def pod_resources(self) -> Path:
        return self.root / "pod-resources"

    @property
    def pod_resources_socket(self) -> Path:
        return self.pod_resources / "kubelet.sock"

    @property
    def state(self) -> Path:
        return self.root / "eventsrc"

    @property
    def log(self) -> Path:
        return self.state / "log"

    @property
    def snapshots(self) -> Path:
        return self.state / "snapshots"

    @property
    def archive(self) -> Path:
        """Sealed segments of what retention cuts took out of the live log (docs/adr/0018)."""
        return self.state / "archive"

    @property
    def usage(self) -> Path:
        """The usage index, derived from the log and rebuilt from it when missing (docs/adr/0026)."""
        return self.state / "usage"

    @property
    def lock(self) -> Path:
        return self.state / "daemon.lock"

    @property
    def status(self) -> Path:
        return self.state / "status.json"

    @property
    def api_socket(self) -> Path:
        return self.state / "api.sock"

    def create(self, own_only: bool = False) -> None:
        """Create the directories (mode 0750, as the kubelet does); ``own_only``: the root and
        eventsrc's state only, none of the kubelet's (beside a kubelet). The root's parent must exist.

        The state directory, which holds the log, is also narrowed to 0750 when it exists
        with more (the kubelet's own directories are left as they are)."""
        if not self.root.exists() and not self.root.parent.is_dir():
            raise EventsrcError(f"cannot create root directory {self.root}: {self.root.parent} does not exist")
        if self.root.exists() and not self.root.is_dir():
            raise EventsrcError(f"root directory {self.root} is not a directory")
        kubelets = () if own_only else (self.device_plugins, self.plugins_registry, self.plugins, self.pod_resources)
        for d in (self.root, *kubelets, self.state):
            try:
                d.mkdir(mode=0o750, exist_ok=True)
            except OSError as exc:
                raise EventsrcError(f"cannot create {d}: {exc.strerror}") from None
        try:
            mode = stat.S_IMODE(self.state.stat().st_mode)
            if mode & 0o027:  # writable by the group, or open to others
                os.chmod(self.state, mode & 0o750)
        except OSError as exc:
            raise EventsrcError(f"cannot narrow {self.state} to mode 0750: {exc.strerror}") from None

    def require_log(self) -> Path:
        """The log directory, or a clear error when there is none."""
        if not self.root.is_dir():
            raise NoLogError(f"root directory {self.root} does not exist")
        if not (self.log / "data.mdb").is_file():
            raise NoLogError(
                f"no event log under {self.root} (expected {self.log}/data.mdb; "
                f"has 'eventsrc serve --root-dir {self.root}' run?)"
            )
        return self.log
