"""``eventsrc audit usage`` through the CLI, on a log built here whose older records are cut into
the archive by the real retention steps: exact totals in json, csv and table, the index built on
first use (said on stderr), the same answer from ``--scan``, bad flags as one line, and
``bench usage`` at a tiny size."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import pytest

from eventsrc import events as ev
from eventsrc.layout import Layout
from eventsrc.log import cut_steps as steps
from eventsrc.log.store import EventLog
from eventsrc.offline.audit_queries import iso
from tests.conftest import run_cli

T0 = 1_577_836_800_000_000_000  # 2020-01-01T00:00:00Z: before now, so --until is the window's end
S = 1_000_000_000
H = 3600 * S
GPU = "example.com/gpu"
UNTIL = iso(T0 + 10 * H)


def own(uid: str, ns: str) -> ev.EventBase:
    return ev.PodAdmitted(pod=ev.PodRef(uid=uid, namespace=ns, name=f"pod-{uid}"))


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("usage") / "root"
    layout = Layout(root)
    layout.state.mkdir(parents=True)
    log = EventLog(layout.log)
    seen = ev.PodRef(uid="", namespace="ml", name="train")
    claim = ev.ClaimRef(uid="c1", namespace="ml", name="gpus")
    dra = [ev.ObservedClaimDevice(driver="dra.example.com", pool="node-a", device="gpu-9")]
    records: list[tuple[int, ev.EventBase]] = [
        (T0, own("a", "team-a")),
        (T0, ev.DevicesAllocated(pod_uid="a", container="m", resource=GPU, device_ids=["gpu-0"])),
        (T0, ev.CPUsAssigned(pod_uid="a", container="m", cpus=[2, 3])),
        (T0 + 2 * H, ev.DevicesReleased(pod_uid="a", container="m", resource=GPU, device_ids=["gpu-0"])),
        (T0 + 2 * H, ev.CPUsAssigned(pod_uid="a", container="m", cpus=[3, 4])),
        (T0 + 3 * H, own("b", "team-b\x1b[2J")),  # a namespace a terminal would act on
        (T0 + 3 * H, ev.DevicesAllocated(pod_uid="b", container="m", resource=GPU, device_ids=["gpu-0"])),
        (T0 + 4 * H, ev.CPUsReleased(pod_uid="a", container="m", cpus=[3, 4])),
        (T0 + 5 * H, ev.KubeletDevicesObserved(pod=seen, container="c", resource=GPU, device_ids=["gpu-7"])),
        (T0 + 5 * H, ev.KubeletClaimObserved(pod=seen, container="c", claim=claim, devices=dra)),
        (T0 + 6 * H, ev.KubeletPodReleased(pod=seen)),
    ]
    for i, (t, e) in enumerate(records):
        log.append([e], f"c{i}", t)
    # records 1..6 (pod a's device and its first CPUs, pod b's admission) go to the archive
    steps.commit(log, steps.prepare(log, layout.archive, 6))
    while steps.delete_some(log)[0]:
        pass
    log.close()
    yield root


def usage(root: Path, *args: str) -> tuple[str, str]:
    proc = run_cli("audit", "usage", *args, root=root, check=True)
    return proc.stdout, proc.stderr


def test_json_totals_are_exact_and_the_index_is_built_on_first_use(root: Path) -> None:
    out, err = usage(root, "--by", "device", "--since", iso(T0 + H), "--until", UNTIL, "-o", "json")
    assert "usage index built from" in err and "first use" in err
    rows = json.loads(out, parse_float=Decimal)
    assert [(r["resource"], r["device"], str(r["seconds"]), str(r["hours"])) for r in rows] == [
        ("cpu", "2", "3600.000000000", "1.000000"),  # [T0, T0+2h] clipped at T0+1h
        ("cpu", "3", "10800.000000000", "3.000000"),  # kept through the change of set
        ("cpu", "4", "7200.000000000", "2.000000"),
        ("dra.example.com", "node-a/gpu-9", "3600.000000000", "1.000000"),
        (GPU, "gpu-0", "28800.000000000", "8.000000"),  # a's 1 h in the window, then b's, open: to --until
        (GPU, "gpu-7", "3600.000000000", "1.000000"),
    ]
    again, err = usage(root, "--by", "device", "--since", iso(T0 + H), "--until", UNTIL, "-o", "json", "--scan")
    assert again == out and "scan of every record" in err


def test_csv_by_namespace_with_a_resource_filter(root: Path) -> None:
    out, _ = usage(root, "--resource", GPU, "--resource", "cpu", "--until", UNTIL, "-o", "csv")
    assert list(csv.reader(io.StringIO(out))) == [
        ["namespace", "resource", "seconds", "hours", "seen", "seconds_in_gaps", "measure"],
        ["ml", GPU, "3600.000000000", "1.000000", "all", "0.000000000", "seconds"],
        # CPU 2 for 2 h, 3 for 4 h, 4 for 2 h
        ["team-a", "cpu", "28800.000000000", "8.000000", "all", "0.000000000", "seconds"],
        ["team-a", GPU, "7200.000000000", "2.000000", "all", "0.000000000", "seconds"],
        ["team-b\\x1b[2J", GPU, "25200.000000000", "7.000000", "all", "0.000000000", "seconds"],
    ]


def test_table_by_pod_is_escaped(root: Path) -> None:
    out, _ = usage(root, "--by", "pod", "--since", iso(T0 + 5 * H + 30 * 60 * S), "--until", UNTIL)
    lines = out.splitlines()
    assert lines[0] == f"usage by pod from {iso(T0 + 5 * H + 30 * 60 * S)} to {UNTIL}: 3 groups"
    assert lines[1].split() == ["NAMESPACE", "NAME", "UID", "RESOURCE", "SECONDS", "HOURS", "SEEN", "IN_GAPS"]
    assert [line.split() for line in lines[2:]] == [
        ["ml", "train", "-", "dra.example.com", "1800.000000000", "0.500000", "all", "-"],
        ["ml", "train", "-", GPU, "1800.000000000", "0.500000", "all", "-"],
        ["team-b\\x1b[2J", "pod-b", "b", GPU, "16200.000000000", "4.500000", "all", "-"],
    ]
    assert "\x1b" not in out


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (("--since", "12"), "usage windows are times"),
        (("--until", "yesterday"), "expected a sequence number or an RFC 3339 time"),
        (("--since", "2026-01-02T00:00:00Z", "--until", "2026-01-01T00:00:00Z"), "is after --until"),
    ],
)
def test_bad_flags_are_one_line(root: Path, flags: tuple[str, ...], says: str) -> None:
    proc = run_cli("audit", "usage", *flags, root=root)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and says in proc.stderr and "Traceback" not in proc.stderr


def test_bench_usage_at_a_tiny_size() -> None:
    proc = run_cli("bench", "usage", "--records", "400", "--runs", "1", check=True)
    assert "the same answer as the index: yes" in proc.stdout
    assert "--by namespace, a month" in proc.stdout and "ABOVE GOAL" not in proc.stdout


def test_seconds_inside_a_gap_are_given_apart_in_json_csv_and_the_table(tmp_path: Path) -> None:
    """eventsrc killed (its last record at T0 + 10 s) while a pod held a device, back at T0 + 37 s:
    27 of the hold's 38 s were not seen, and every output says so."""
    root = tmp_path / "root"
    layout = Layout(root)
    layout.state.mkdir(parents=True)
    log = EventLog(layout.log)
    seen = ev.PodRef(uid="u1", namespace="ml", name="train")
    for i, (t, e) in enumerate(
        [
            (T0, ev.KubeletDevicesObserved(pod=seen, container="c", resource=GPU, device_ids=["Dev-1"])),
            (T0 + 10 * S, ev.KubeletPodObserved(pod=seen)),
            (T0 + 37 * S, ev.ObservationGapFound(source="eventsrc", since_ns=T0 + 10 * S, until_ns=T0 + 37 * S)),
            (T0 + 38 * S, ev.KubeletPodReleased(pod=seen)),
        ]
    ):
        log.append([e], f"c{i}", t)
    log.close()
    out, _ = usage(root, "--by", "pod", "--until", UNTIL, "-o", "json")
    assert [(r["seconds"], r["seconds_seen"], r["seconds_in_gaps"]) for r in json.loads(out, parse_float=Decimal)] == [
        (Decimal("38.000000000"), Decimal("11.000000000"), Decimal("27.000000000"))
    ]
    out, _ = usage(root, "--by", "device", "--until", UNTIL, "-o", "csv")
    assert list(csv.reader(io.StringIO(out)))[1] == [
        GPU, "Dev-1", "38.000000000", "0.010556", "partly", "27.000000000", "seconds"
    ]  # fmt: skip
    out, _ = usage(root, "--by", "namespace", "--until", UNTIL, "--scan")
    assert out.splitlines()[2].split() == ["ml", GPU, "38.000000000", "0.010556", "partly", "27.000000000"]
    assert "SEEN partly/none: some seconds (IN_GAPS) fell inside a gap" in out
