"""What the CLI answers says what happened: the removal's own sequence, and why a plugin's
resource had no devices (a plugin that registered but never listed them is not one that
never registered)."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc

from tests.conftest import Daemon, run_cli
from tests.support.grpcio_plugin import Dev, GrpcioPlugin, _Servicer
from tests.support.grpcio_stubs import device_plugin_handler, unix_target

RES = "example.com/gpu"


def pod_file(tmp_path: Path, name: str, limits: str = "") -> Path:
    path = tmp_path / f"{name}.yaml"
    resources = f"\n    resources:\n      limits:\n        {limits}" if limits else ""
    path.write_text(
        f"apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: default\n  uid: {uuid.uuid4()}\n"
        f"spec:\n  containers:\n  - name: app\n    image: busybox{resources}\n"
    )
    return path


def records(root: Path, type_: str) -> list[dict[str, Any]]:
    out = run_cli("log", "-o", "json", root=root, check=True).stdout.splitlines()
    return [r for r in map(json.loads, out) if r["type"] == type_]


def test_remove_prints_the_removals_sequence(daemon_factory: type[Daemon], tmp_path: Path) -> None:
    daemon = daemon_factory()
    root = daemon.root
    admitted = json.loads(
        run_cli("admit", "-f", str(pod_file(tmp_path, "a")), "-o", "json", root=root, check=True).stdout
    )
    run_cli("admit", "-f", str(pod_file(tmp_path, "b")), root=root, check=True)  # records between the two
    removed = json.loads(run_cli("remove", "default/a", "-o", "json", root=root, check=True).stdout)
    (rec,) = [r for r in records(root, "PodRemoved") if r["event"]["pod_uid"] == admitted["uid"]]
    assert int(removed["removed_seq"]) == rec["seq"] != int(admitted["admitted_seq"])
    # The text answer names the removal's record too.
    text = run_cli("remove", "default/b", root=root, check=True).stdout
    (rec_b,) = [r for r in records(root, "PodRemoved") if r["event"]["pod_uid"] != admitted["uid"]]
    assert f"removed  (seq {rec_b['seq']})" in text.splitlines()[0]


class _Silent(_Servicer):
    """Registers, then never sends a device list (its ListAndWatch stays open, empty)."""

    def ListAndWatch(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        self.p._record("ListAndWatch")
        done = threading.Event()
        context.add_callback(done.set)
        done.wait()
        return iter(())


class SilentPlugin(GrpcioPlugin):
    def start(self) -> SilentPlugin:
        self.socket.unlink(missing_ok=True)
        from concurrent import futures

        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        server.add_generic_rpc_handlers([device_plugin_handler(_Silent(self))])
        server.add_insecure_port(unix_target(self.socket))
        server.start()
        self._server = server
        return self


def test_a_plugin_that_registered_but_never_listed_is_named_so(daemon_factory: type[Daemon], tmp_path: Path) -> None:
    daemon = daemon_factory("--admission-wait", "1")
    root = daemon.root
    plugin = SilentPlugin(root, RES, [Dev("gpu-0")]).start()
    try:
        ok, error = plugin.register()
        assert ok, error
        daemon.eventually(lambda: plugin.calls("ListAndWatch"), "the daemon's ListAndWatch call")
        (registered,) = records(root, "PluginRegistered")
        proc = run_cli("admit", "-f", str(pod_file(tmp_path, "p", f"{RES}: 1")), root=root)
        assert proc.returncode == 1, proc.stdout
        assert f"its plugin registered at seq {registered['seq']} but sent no device list within 1 s" in proc.stderr, (
            proc.stderr
        )
        assert "did not register" not in proc.stderr
    finally:
        plugin.stop()
