"""Migration from the kubelet: its checkpoint files, their checksums, and the import.

The published checksum examples come from ../shared/kubelet-api.md section 5: real device
checkpoints quoted in public docs, the kubelet's own unit-test vectors, and the facts
file's worked examples. The fixtures under tests/fixtures/kubelet/ were written by the
rules of that section (spew-FNV for the device and CPU files, CRC32 for DRA).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import grpc
import pytest

from eventsrc import events as ev
from eventsrc.gen.podresources.v1 import api_pb2 as pr
from eventsrc.inputs import kubelet_checkpoints as ki
from tests.conftest import run_cli
from tests.support.grpcio_stubs import pod_resources_client, unix_target

FIXTURES = Path(__file__).parent.parent / "fixtures" / "kubelet"
TOPOLOGY = FIXTURES / "topology-8.json"
RESERVED = "0,4"  # the CPUs the kubelet file leaves in its default set and assigns to nobody
POD_A = "0f6e5d1c-0000-4000-8000-00000000a001"
POD_B = "0f6e5d1c-0000-4000-8000-00000000b002"
POD_C = "0f6e5d1c-0000-4000-8000-00000000c003"

# (name, parser, file content, checksum, (a substring of the checksummed content, a one-byte change of it))
_GPU_DOC = (
    '{"Data":{"PodDeviceEntries":null,"RegisteredDevices":{"nvidia.com/gpu":["GPU-0650a168-e770-3ea8-8ac3-8a1d419763e0"]}},'
    '"Checksum":3952659280}'
)
_TEGRA_DOC = (
    '{"Data":{"PodDeviceEntries":[{"PodUID":"bf52b2cd-b611-4e79-86b1-280b283185c3","ContainerName":"check",'
    '"ResourceName":"nvidia.com/gpu","DeviceIDs":{"-1":["tegra"]},"AllocResp":"Ch8KFk5WSURJQV9WSVNJQkxFX0RFVklDRVMSBXRlZ3Jh"}],'
    '"RegisteredDevices":{"nvidia.com/gpu":["tegra"]}},"Checksum":3660592824}'
)
_FPGA_FACTS = (
    '{"Data":{"PodDeviceEntries":[{"PodUID":"0f6e5d1c-0000-4000-8000-00000000a001","ContainerName":"app",'
    '"ResourceName":"example.com/fpga","DeviceIDs":{"0":["fpga-0"]},'
    '"AllocResp":"ChIKCEZQR0FfSURTEgZmcGdhLTAaHAoKL2Rldi9mcGdhMBIKL2Rldi9mcGdhMBoCcnc="}],'
    '"RegisteredDevices":{"example.com/fpga":["fpga-0","fpga-1"]}},"Checksum":3813108315}'
)


def _dra(entries: str, checksum: int) -> str:
    return json.dumps(
        {
            "Data": '{"kind":"DRACheckpoint","apiVersion":"checkpoint.dra.kubelet.k8s.io/v1","Entries":['
            + entries
            + "]}",
            "Checksum": checksum,
        }
    )


_DRA_DEV1 = (
    '{"ClaimUID":"067798be-454e-4be4-9047-1aa06aea63f7","ClaimName":"example","Namespace":"default",'
    '"PodUIDs":{"139cdb46-f989-4f17-9561-ca10cfb509a6":{}},"DriverState":{"test-driver.cdi.k8s.io":{"Devices":['
    '{"PoolName":"worker-1","DeviceName":"dev-1","RequestNames":["test request"],'
    '"CDIDeviceIDs":["example.com/example=cdi-example"]}'
)
_DRA_DEV2 = (
    '{"PoolName":"worker-1","DeviceName":"dev-2","RequestNames":["test request"],'
    '"CDIDeviceIDs":["example.com/example=cdi-example"]}'
)
_DRA_TWO = (
    '{"ClaimUID":"067798be-454e-4be4-9047-1aa06aea63f7","ClaimName":"example-1","Namespace":"default",'
    '"PodUIDs":{"139cdb46-f989-4f17-9561-ca10cfb509a6":{}},"DriverState":{"test-driver.cdi.k8s.io":{"Devices":['
    '{"PoolName":"worker-1","DeviceName":"dev-1","RequestNames":["test request"],'
    '"CDIDeviceIDs":["example.com/example=cdi-example"]}]}}},'
    '{"ClaimUID":"4cf8db2d-06c0-7d70-1a51-e59b25b2c16c","ClaimName":"example-2","Namespace":"default",'
    '"PodUIDs":{"139cdb46-f989-4f17-9561-ca10cfb509a6":{}},"DriverState":{"test-driver.cdi.k8s.io":{"Devices":['
    '{"PoolName":"worker-1","DeviceName":"dev-2","RequestNames":null,"CDIDeviceIDs":null}]}}}'
)
_DRA_FACTS = (
    '{"ClaimUID":"7c1d0a52-0000-4000-8000-00000000c001","ClaimName":"gpu-claim","Namespace":"default",'
    '"PodUIDs":{"0f6e5d1c-0000-4000-8000-00000000a001":{}},"DriverState":{"gpu.example.com":{"Devices":['
    '{"PoolName":"node-a","DeviceName":"gpu-0","RequestNames":["gpu"],"CDIDeviceIDs":["example.com/gpu=gpu-0"]}]}}}'
)

PUBLISHED = [
    # device manager: real checkpoint files quoted in public docs, and the facts file's example
    ("device GPUOps doc", ki.parse_device_checkpoint, _GPU_DOC, 3952659280, ("419763e0", "419763e1")),
    ("device tegra doc", ki.parse_device_checkpoint, _TEGRA_DOC, 3660592824, ('"check"', '"checK"')),
    ("device facts fpga", ki.parse_device_checkpoint, _FPGA_FACTS, 3813108315, ('"fpga-1"]', '"fpga-2"]')),
    # CPU manager: the kubelet's unit-test vectors (V2 and V1) and the facts file's examples
    (
        "cpu default set",
        ki.parse_cpu_state,
        '{"policyName":"none","defaultCPUSet":"4-6","entries":{},"checksum":354655845}',
        354655845,
        ("4-6", "4-5"),
    ),
    (
        "cpu valid",
        ki.parse_cpu_state,
        '{"policyName":"none","defaultCPUSet":"1-3","entries":{"pod":{"container1":"4-6","container2":"1-3"}},"checksum":3610638499}',
        3610638499,
        ('"container1":"4-6"', '"container1":"4-7"'),
    ),
    (
        "cpu facts static",
        ki.parse_cpu_state,
        '{"policyName":"static","defaultCpuSet":"0,3-7","entries":{"0f6e5d1c-0000-4000-8000-00000000a001":{"app":"1-2"}},"checksum":233944212}',
        233944212,
        ('"app"', '"apP"'),
    ),
    (
        "cpu facts none",
        ki.parse_cpu_state,
        '{"policyName":"none","defaultCpuSet":"","checksum":1353318690}',
        1353318690,
        ('"none"', '"nonE"'),
    ),
    (
        "cpu v1 no entries",
        ki.parse_cpu_state,
        '{"policyName":"none","defaultCPUSet":"1-3","checksum":1694838852}',
        1694838852,
        ("1-3", "1-2"),
    ),
    (
        "cpu v1 migration",
        ki.parse_cpu_state,
        '{"policyName":"static","defaultCPUSet":"7-9","entries":{"containerID1":"4-6","containerID2":"1-3"},"checksum":2026311253}',
        2026311253,
        ('"containerID2"', '"containerID3"'),
    ),
    # DRA manager (CRC32): the kubelet's unit-test vectors and the facts file's example
    ("dra single", ki.parse_dra_state, _dra(_DRA_DEV1 + "]}}}", 1597924435), 1597924435, ("dev-1", "dev-9")),
    (
        "dra two devices",
        ki.parse_dra_state,
        _dra(_DRA_DEV1 + "," + _DRA_DEV2 + "]}}}", 1812303514),
        1812303514,
        ("dev-2", "dev-3"),
    ),
    ("dra two claims", ki.parse_dra_state, _dra(_DRA_TWO, 3633532417), 3633532417, ("example-2", "example-3")),
    ("dra facts", ki.parse_dra_state, _dra(_DRA_FACTS, 3066407621), 3066407621, ("gpu-claim", "gpu-claiM")),
]


@pytest.mark.parametrize(("name", "parse", "content", "checksum", "change"), PUBLISHED, ids=[p[0] for p in PUBLISHED])
def test_published_checksum_examples_verify(name, parse, content, checksum, change) -> None:  # type: ignore[no-untyped-def]
    assert parse(content, name).checksum == checksum
    old, new = change
    assert content.count(old) >= 1 and len(old) == len(new)
    changed = content.replace(old, new, 1)
    with pytest.raises(ki.ChecksumMismatchError) as info:
        parse(changed, name)
    msg = str(info.value)
    assert msg.startswith(f"{name}: checkpoint is corrupted") and str(checksum) in msg
    assert str(info.value.computed) in msg and info.value.computed != checksum


def test_kubelet_corrupt_vectors_are_refused() -> None:
    # The kubelet's own "checkpoint is corrupted" test cases.
    with pytest.raises(ki.ChecksumMismatchError, match="checksum is 1337 but its content gives 354655845"):
        ki.parse_cpu_state('{"policyName":"none","defaultCPUSet":"4-6","entries":{},"checksum":1337}', "cpu")
    with pytest.raises(ki.ChecksumMismatchError, match="checksum is 2930258365 but its content gives 3633532417"):
        ki.parse_dra_state(_dra(_DRA_TWO, 2930258365), "dra")


def test_alloc_resp_is_decoded_from_the_proto() -> None:
    events = ki.events_from(ki.parse_device_checkpoint(_TEGRA_DOC))
    (alloc,) = [e for e in events if isinstance(e, ev.DevicesAllocated)]
    assert alloc.device_ids == ["tegra"] and alloc.response.envs == {"NVIDIA_VISIBLE_DEVICES": "tegra"}
    events = ki.events_from(ki.parse_device_checkpoint(_FPGA_FACTS))
    (alloc,) = [e for e in events if isinstance(e, ev.DevicesAllocated)]
    assert alloc.response == ev.ContainerAllocation(
        envs={"FPGA_IDS": "fpga-0"},
        devices=[ev.DeviceSpec(container_path="/dev/fpga0", host_path="/dev/fpga0", permissions="rw")],
    )
    (added,) = [e for e in events if isinstance(e, ev.DevicesAdded)]
    assert added.devices == [
        ev.DeviceInfo(id="fpga-0", health="Healthy", numa_nodes=[0]),
        ev.DeviceInfo(id="fpga-1", health="Healthy", numa_nodes=[]),
    ]


def test_zero_cpu_checksum_is_accepted_unverified() -> None:
    cp = ki.parse_cpu_state('{"policyName":"none","defaultCpuSet":"0-3","checksum":0}', "cpu")
    assert cp.verified is False


def test_device_v1_and_boot_id() -> None:
    # V1 (flat DeviceIDs), checksummed by the rules of section 5.1 (type names of V2).
    cp = ki.DeviceCheckpoint(
        source="v1",
        version="v1",
        entries=[
            ki.PodDevicesEntry(
                pod_uid="p",
                container_name="c",
                resource_name="example.com/dev",
                flat_device_ids=["d0", "d1"],
                alloc_resp=b"",
            )
        ],
        registered_devices={"example.com/dev": ["d0", "d1", "d2"]},
        checksum=0,
    )
    text = ki.device_checksum_text(cp)
    assert "DeviceIDs:([]string)[d0 d1] AllocResp:([]uint8)[]" in text
    content = json.dumps(
        {
            "Data": {
                "PodDeviceEntries": [
                    {
                        "PodUID": "p",
                        "ContainerName": "c",
                        "ResourceName": "example.com/dev",
                        "DeviceIDs": ["d0", "d1"],
                        "AllocResp": "",
                    }
                ],
                "RegisteredDevices": {"example.com/dev": ["d0", "d1", "d2"]},
            },
            "Checksum": ki.fnv32a(text),
            "BootID": "b",
        }
    )
    parsed = ki.parse_device_checkpoint(content, "v1")
    assert parsed.version == "v1" and parsed.boot_id == "b"
    (alloc,) = [e for e in ki.events_from(parsed) if isinstance(e, ev.DevicesAllocated)]
    assert alloc.device_ids == ["d0", "d1"]


def test_unsupported_formats_are_refused_clearly() -> None:
    # a data string without its dataChecksum: refused as 1.37 refuses it (no fallback to older formats)
    with pytest.raises(ki.ChecksumMismatchError, match="checksum is 0 but its content gives 657950972"):
        ki.parse_cpu_state(
            '{"data":"{\\"policyName\\":\\"none\\",\\"defaultCPUSet\\":\\"4-6\\"}","checksum":657950972}', "cpu"
        )
    with pytest.raises(ki.CheckpointError, match="old DRA checkpoint format"):
        ki.parse_dra_state('{"version":"v1","entries":[],"checksum":1}', "dra")
    v1 = ki.parse_cpu_state(PUBLISHED[8][2], "cpu")
    with pytest.raises(ki.CheckpointError, match="keys its 2 entries by container id"):
        ki.events_from(cpu=v1)


FILES = (
    "--device-checkpoint", str(FIXTURES / "kubelet_internal_checkpoint"),
    "--cpu-state", str(FIXTURES / "cpu_manager_state"),
    "--dra-state", str(FIXTURES / "dra_manager_state"),
)  # fmt: skip


def test_fixtures_verify() -> None:
    device = ki.read_device_checkpoint(FIXTURES / "kubelet_internal_checkpoint")
    cpu = ki.read_cpu_state(FIXTURES / "cpu_manager_state")
    dra = ki.read_dra_state(FIXTURES / "dra_manager_state")
    assert device.version == "v2" and device.boot_id and cpu.version == "v2" and cpu.policy_name == "static"
    s = ki.summarize(ki.events_from(device, cpu, dra))
    assert (s.pods, s.resources, s.devices, s.device_allocations, s.cpu_assignments, s.claims) == (3, 2, 6, 3, 3, 2)


def test_import_then_daemon_serves_the_same_assignments(root: Path, daemon_factory) -> None:  # type: ignore[no-untyped-def]
    proc = run_cli("import-kubelet", *FILES, "-o", "json", root=root, check=True)
    out = json.loads(proc.stdout)
    assert out["summary"]["pods"] == 3 and out["summary"]["cpu_assignments"] == 3 and out["first_seq"] == 1
    records = [json.loads(line) for line in run_cli("log", "-o", "json", root=root, check=True).stdout.splitlines()]
    assert len(records) == out["summary"]["events"] and {r["correlation_id"] for r in records} == {
        out["correlation_id"]
    }

    # The kubelet file's assignments, as PodResources must show them.
    cpu_file = json.loads((FIXTURES / "cpu_manager_state").read_text())
    expected = {
        name: sorted(ki.CPUSet.parse(cpus).sorted_list())
        for containers in cpu_file["entries"].values()
        for name, cpus in containers.items()
    }
    daemon_factory("--cpu-manager-policy", "static", "--topology-file", str(TOPOLOGY), "--reserved-cpus", RESERVED)
    with grpc.insecure_channel(unix_target(root / "pod-resources" / "kubelet.sock")) as ch:
        listed = pod_resources_client(ch).List(pr.ListPodResourcesRequest())
    # The checkpoints hold no pod names: container names are unique across the fixture's pods.
    got = {c.name: sorted(c.cpu_ids) for p in listed.pod_resources for c in p.containers}
    assert got == expected
    # Devices too, grouped per NUMA node as the kubelet groups them (fpga-2 is on node 1).
    devices: dict[tuple[str, str], list[str]] = {}
    for p in listed.pod_resources:
        for c in p.containers:
            for d in c.devices:
                devices.setdefault((c.name, d.resource_name), []).extend(d.device_ids)
    assert devices == {
        ("app", "example.com/fpga"): ["fpga-0"],
        ("web", "example.com/nic"): ["nic-0"],
        ("worker", "example.com/fpga"): ["fpga-1", "fpga-2"],
    }
    assert len(listed.pod_resources) == 3 and all(p.name == "" and p.namespace == "" for p in listed.pod_resources)
    state = json.loads(run_cli("state", "-o", "json", root=root, check=True).stdout)
    assert state["cpus"]["assignments"][POD_B] == {"web": [2, 6], "worker": [3, 7]}
    assert sorted(state["cpus"]["shared"]) == [0, 4]
    assert state["claims"]["claims"]["7c1d0a52-0000-4000-8000-00000000c001"]["state"] == "prepared"
    assert state["claims"]["claims"]["7c1d0a52-0000-4000-8000-00000000c002"]["pods"] == [POD_C]


def test_import_refused_while_a_daemon_runs(root: Path, daemon_factory) -> None:  # type: ignore[no-untyped-def]
    daemon_factory()
    before = run_cli("log", "-o", "json", root=root, check=True).stdout
    proc = run_cli("import-kubelet", *FILES, root=root)
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "is running on" in proc.stderr and "stop it before importing" in proc.stderr
    assert run_cli("log", "-o", "json", root=root, check=True).stdout == before


def test_corrupted_checksum_is_refused_and_nothing_is_written(root: Path, tmp_path: Path) -> None:
    good = (FIXTURES / "cpu_manager_state").read_text()
    bad = tmp_path / "cpu_manager_state"
    bad.write_text(good.replace('"web":"2,6"', '"web":"2,7"'))
    proc = run_cli("import-kubelet", *FILES[:2], "--cpu-state", str(bad), root=root)
    assert proc.returncode == 1 and proc.stdout == ""
    line = proc.stderr.strip()
    assert (
        "\n" not in line and str(bad) in line and "checkpoint is corrupted" in line and "nothing was imported" in line
    )
    assert str(json.loads(good)["checksum"]) in line
    assert not (root / "eventsrc" / "log" / "data.mdb").exists()


def test_importing_twice_is_refused_unless_forced(root: Path) -> None:
    run_cli("import-kubelet", "--cpu-state", str(FIXTURES / "cpu_manager_state"), root=root, check=True)
    proc = run_cli("import-kubelet", "--cpu-state", str(FIXTURES / "cpu_manager_state"), root=root)
    assert proc.returncode == 1 and "already has 2 pod(s)" in proc.stderr and "--force" in proc.stderr
    n = len(run_cli("log", root=root, check=True).stdout.splitlines())
    proc = run_cli(
        "import-kubelet", "--cpu-state", str(FIXTURES / "cpu_manager_state"), "--force", root=root, check=True
    )
    assert "imported into" in proc.stdout
    assert len(run_cli("log", root=root, check=True).stdout.splitlines()) > n


def test_dry_run_prints_events_and_writes_nothing(root: Path) -> None:
    proc = run_cli("import-kubelet", *FILES, "--dry-run", "-o", "json", root=root, check=True)
    out = json.loads(proc.stdout)
    assert out["dry_run"] is True and [e["type"] for e in out["events"]].count("PodAdmitted") == 3
    assert not root.exists()
    proc = run_cli("import-kubelet", *FILES, "--dry-run", root=root, check=True)
    assert "CPUsAssigned" in proc.stdout and "would import: 3 pods" in proc.stdout
    proc = run_cli("import-kubelet", root=root)
    assert proc.returncode == 1 and "nothing to import" in proc.stderr


def test_a_fifo_or_a_link_given_to_import_is_one_line_and_nothing_waits(root: Path, tmp_path: Path) -> None:
    """Issue 34: the files import-kubelet reads are opened without blocking (a FIFO used to wait for
    a writer for ever) and a link is not followed."""
    fifo = tmp_path / "cpu_manager_state"
    os.mkfifo(fifo)
    link = tmp_path / "kubelet_internal_checkpoint"
    link.symlink_to("/dev/zero")
    for flag, path, words in (("--cpu-state", fifo, "FIFO"), ("--device-checkpoint", link, "symbolic link")):
        proc = run_cli("import-kubelet", flag, str(path), root=root, timeout=30)
        assert proc.returncode != 0 and words in proc.stderr, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
