"""The configuration file: strict decoding, flags over the file, and its changes on record."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
import yaml

from eventsrc import events as ev
from eventsrc.inputs import config
from tests.conftest import REPO, run_cli
from tests.e2e.test_cli import one_clean_error

EXAMPLE = REPO / "examples" / "eventsrc-config.yaml"


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def error_of(text: str, name: str = "/x/c.yaml") -> str:
    with pytest.raises(config.ConfigError) as info:
        config.decode(text.encode(), name)
    return str(info.value)


# ---------------------------------------------------------------------------- decoding (pure)


def test_unknown_field_is_named_with_a_suggestion() -> None:
    assert error_of("cpuManagerPolicyy: static\n") == (
        "config file /x/c.yaml: unknown field 'cpuManagerPolicyy'; did you mean 'cpuManagerPolicy'?"
    )
    assert error_of("somethingElse: 1\n") == "config file /x/c.yaml: unknown field 'somethingElse'"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("snapshotEvery: often\n", "snapshotEvery: expected int, got str"),
        ("snapshotEvery: 0\n", "snapshotEvery: expected int >= 1"),
        ("reservedCPUCount: -1\n", "reservedCPUCount: expected int >= 0"),
        ("cpuManagerPolicy: statc\n", "cpuManagerPolicy: invalid value 'statc' (expected one of: none, static)"),
        ("logFormat: xml\n", "logFormat: invalid value 'xml' (expected one of: text, json)"),
        ("featureGates:\n  A: true\n  B: maybe\n", "featureGates['B']: expected bool, got str"),
        (
            "cpuManagerPolicyOptions:\n  full-pcpus-only: true\n",
            "cpuManagerPolicyOptions['full-pcpus-only']: expected str, got bool",
        ),
        ("admissionWait: 30\n", 'admissionWait: expected a duration string like "30s" or "5m", got int'),
        ("pluginGracePeriod: 5 minutes\n", 'pluginGracePeriod: invalid duration "5 minutes"'),
        ("featureGates: [a]\n", "featureGates: expected object, got array"),
    ],
)
def test_wrong_type_or_value_names_the_key(text: str, expected: str) -> None:
    assert error_of(text).startswith(f"config file /x/c.yaml: {expected}")


def test_not_a_mapping_and_not_yaml() -> None:
    assert error_of("- a\n- b\n") == "config file /x/c.yaml: expected a mapping of fields, got list"
    assert error_of("a: [\n").startswith("config file /x/c.yaml: not valid YAML: ")
    assert error_of("a = [\n", "/x/c.toml").startswith("config file /x/c.toml: not valid TOML: ")


def test_api_version_and_kind_are_optional_but_checked() -> None:
    assert config.decode(b"", "c.yaml") == config.Configuration()
    ok = config.decode(f"apiVersion: {config.API_VERSION}\nkind: EventsrcConfiguration\n".encode(), "c.yaml")
    assert ok.kind == "EventsrcConfiguration"
    assert "kind: 'KubeletConfiguration' is not 'EventsrcConfiguration'" in error_of("kind: KubeletConfiguration\n")
    assert "apiVersion: 'v9' is not" in error_of("apiVersion: v9\n")


def test_yaml_and_toml_say_the_same() -> None:
    from_yaml = config.decode(
        b"cpuManagerPolicy: static\nreservedSystemCPUs: '0-1'\nfeatureGates: {CPUManagerPolicyAlphaOptions: true}\n"
        b"admissionWait: 1m30s\n",
        "c.yaml",
    )
    from_toml = config.decode(
        b'cpuManagerPolicy = "static"\nreservedSystemCPUs = "0-1"\nadmissionWait = "1m30s"\n'
        b"[featureGates]\nCPUManagerPolicyAlphaOptions = true\n",
        "c.toml",
    )
    assert from_yaml == from_toml
    assert from_yaml.admission_wait.seconds == 90 and from_yaml.feature_gates == {"CPUManagerPolicyAlphaOptions": True}


@pytest.mark.parametrize(
    ("text", "seconds", "printed"),
    [
        ("0", 0, "0s"),
        ("30s", 30, "30s"),
        ("5m", 300, "5m0s"),
        ("1h2m3.5s", 3723.5, "1h2m3.5s"),
        ("1.5h", 5400, "1h30m0s"),
        ("500ms", 0.5, "500ms"),
        ("1m30s", 90, "1m30s"),
        ("2h", 7200, "2h0m0s"),
    ],
)
def test_durations_as_go_reads_and_prints_them(text: str, seconds: float, printed: str) -> None:
    d = config.Duration.parse(text)
    assert d.seconds == seconds and str(d) == printed
    assert config.Duration.parse(printed) == d


@pytest.mark.parametrize("text", ["", "30", "s", "-5s", "5 s", "5sec", "1.2.3s"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(ValueError, match="invalid duration"):
        config.Duration.parse(text)


def test_relative_paths_are_relative_to_the_file(tmp_path: Path) -> None:
    cfg = config.load(write(tmp_path / "c.yaml", "topologyFile: t.json\nrootDir: r\nsysfsRoot: /s\n"))
    assert (cfg.topology_file, cfg.root_dir, cfg.sysfs_root) == (str(tmp_path / "t.json"), str(tmp_path / "r"), "/s")


def test_the_fleets_password_file_is_relative_to_the_file_and_a_user_needs_one(tmp_path: Path) -> None:
    cfg = config.load(write(tmp_path / "c.yaml", "fleet: {user: worker-1, passwordFile: secret/nats}\n"))
    assert (cfg.fleet.user, cfg.fleet.password_file) == ("worker-1", str(tmp_path / "secret" / "nats"))
    config.check(cfg)
    with pytest.raises(config.ConfigError, match=r"fleet.user \(--fleet-nats-user\): needs fleet.passwordFile"):
        config.check(config.decode(b"fleet: {user: worker-1}\n", "c.yaml"))


def test_merge_overrides_and_names_the_flag() -> None:
    base = config.decode(b"snapshotEvery: 100\nlogLevel: debug\n", "c.yaml")
    merged = config.merge(base, {"snapshotEvery": 7, "admissionWait": config.Duration.of_seconds(2)})
    assert (merged.snapshot_every, merged.log_level, str(merged.admission_wait)) == (7, "debug", "2s")
    with pytest.raises(config.ConfigError, match=r"^--snapshot-every: expected int >= 1$"):
        config.merge(base, {"snapshotEvery": 0})


def test_check_reuses_the_kubelet_validation() -> None:
    with pytest.raises(
        config.ConfigError, match=r"cpuManagerPolicyOptions \(--cpu-manager-policy-options\): .*no-such"
    ):
        config.check(config.Configuration(cpu_manager_policy_options={"no-such": "true"}))
    with pytest.raises(Exception, match=r"topologyManagerPolicy \(--topology-manager-policy\) \"nearest\""):
        config.check(config.Configuration(topology_manager_policy="nearest"))
    with pytest.raises(config.ConfigError, match=r"reservedSystemCPUs \(--reserved-cpus\)"):
        config.check(config.Configuration(reserved_system_cpus="0-x"))
    config.check(config.decode(EXAMPLE.read_bytes(), str(EXAMPLE)))


def test_changes_names_the_fields_that_differ() -> None:
    old = config.recorded(config.Configuration(root_dir="/r"))
    new = config.recorded(config.Configuration(root_dir="/r", snapshot_every=5, log_level="debug"))
    assert config.changes({}, new) is None  # the first start: nothing to differ from
    assert config.changes(new, dict(new)) is None
    e = config.changes(old, new)
    assert isinstance(e, ev.ConfigurationChanged)
    assert (
        e.changed == ["logLevel", "snapshotEvery"] and e.old["snapshotEvery"] == 10_000 and e.new["snapshotEvery"] == 5
    )


# ---------------------------------------------------------------------------- the command line


def test_typo_is_one_line_and_nothing_starts(root: Path, tmp_path: Path) -> None:
    bad = write(tmp_path / "c.yaml", "cpuManagerPolicyy: static\n")
    proc = run_cli("serve", "--config", str(bad), root=root, timeout=30)
    one_clean_error(proc, f"config file {bad}: unknown field 'cpuManagerPolicyy'", "did you mean 'cpuManagerPolicy'?")
    assert not root.exists()  # no lock taken, no log written
    one_clean_error(run_cli("config", "print", "--config", str(bad), root=root), "unknown field 'cpuManagerPolicyy'")


def test_the_nri_namespaces_and_runtime_endpoint_flags(root: Path, tmp_path: Path) -> None:
    def printed(*args: str) -> dict[str, object]:
        out: dict[str, object] = json.loads(
            run_cli("config", "print", *args, "-o", "json", root=root, check=True).stdout
        )
        return out

    got = printed(
        "--nri-annotation-namespaces", "team-a, team-b,", "--container-runtime-endpoint", "unix:///run/x.sock"
    )
    assert got["nriAnnotationNamespaces"] == ["team-a", "team-b"]
    assert got["containerRuntimeEndpoint"] == "unix:///run/x.sock"
    assert printed()["nriAnnotationNamespaces"] == [] and printed()["containerRuntimeEndpoint"] == ""
    one_clean_error(
        run_cli("config", "print", "--nri-annotation-namespaces", "team-a,Team_B", root=root),
        "--nri-annotation-namespaces",
    )
    for bad in ("tcp://10.0.0.1:1234", "run/x.sock"):
        one_clean_error(
            run_cli("config", "print", "--container-runtime-endpoint", bad, root=root),
            "containerRuntimeEndpoint (--container-runtime-endpoint)",
            "is not unix:///PATH or an absolute path",
        )


def test_wrong_type_is_one_line_naming_the_key(root: Path, tmp_path: Path) -> None:
    bad = write(tmp_path / "c.toml", 'snapshotEvery = "often"\n')
    one_clean_error(
        run_cli("serve", "--config", str(bad), root=root, timeout=30), "snapshotEvery: expected int, got str"
    )
    bad = write(tmp_path / "c.yaml", "topologyManagerPolicy: nearest\n")
    one_clean_error(run_cli("serve", "--config", str(bad), root=root, timeout=30), "topologyManagerPolicy", '"nearest"')
    missing = tmp_path / "missing.yaml"
    one_clean_error(
        run_cli("serve", "--config", str(missing), root=root, timeout=30), f"config file {missing}: No such file"
    )
    assert not root.exists()


def test_an_empty_node_name_is_refused_in_one_line_not_taken_for_the_host_name(root: Path, tmp_path: Path) -> None:
    flag = run_cli("serve", "--fleet-nats", "nats://127.0.0.1:1", "--node-name", "", root=root, timeout=30)
    one_clean_error(flag, "--node-name is empty")
    for name, text in (("c.yaml", "fleet:\n  nodeName: ''\n"), ("c.toml", '[fleet]\nnodeName = ""\n')):
        bad = write(tmp_path / name, text)
        one_clean_error(run_cli("serve", "--config", str(bad), root=root, timeout=30), "fleet.nodeName is empty")
    assert not root.exists()  # nothing started
    # left out, the host name names the node, as before; config print leaves it out too (a valid file)
    printed = run_cli("config", "print", root=root, check=True).stdout
    assert "nodeName" not in printed
    again = write(tmp_path / "again.yaml", printed)
    assert run_cli("config", "print", "--config", str(again), root=root, check=True).stdout == printed


def test_flags_override_the_file_and_print_shows_the_result(root: Path, tmp_path: Path) -> None:
    cfg = write(
        tmp_path / "c.yaml", "snapshotEvery: 100\nadmissionWait: 2m\nlogLevel: debug\ntopologyManagerScope: pod\n"
    )
    printed = yaml.safe_load(run_cli("config", "print", "--config", str(cfg), root=root, check=True).stdout)
    assert printed["snapshotEvery"] == 100 and printed["admissionWait"] == "2m0s" and printed["logLevel"] == "debug"
    assert printed["rootDir"] == str(root) and printed["kind"] == "EventsrcConfiguration"
    assert printed["pluginGracePeriod"] == "5m0s" and printed["cpuManagerPolicy"] == "none"  # defaults
    proc = run_cli(
        "--log-level",
        "warning",
        "config",
        "print",
        "--config",
        str(cfg),
        "--snapshot-every",
        "7",
        "--admission-wait",
        "1.5",
        "--feature-gates",
        "CPUManagerPolicyAlphaOptions=true",
        "-o",
        "json",
        root=root,
        check=True,
    )
    printed = json.loads(proc.stdout)
    assert printed["snapshotEvery"] == 7 and printed["admissionWait"] == "1.5s" and printed["logLevel"] == "warning"
    assert printed["topologyManagerScope"] == "pod"  # from the file: no flag given
    assert printed["featureGates"] == {"CPUManagerPolicyAlphaOptions": True}
    # The printed configuration is a configuration file.
    again = write(tmp_path / "again.yaml", yaml.safe_dump(printed))
    assert (
        json.loads(run_cli("config", "print", "--config", str(again), "-o", "json", root=root, check=True).stdout)
        == printed
    )
    assert not root.exists()  # printing starts nothing


def test_root_dir_flag_env_and_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # --root-dir, else EVENTSRC_ROOT_DIR, else the file's rootDir, else the kubelet's default.
    monkeypatch.delenv("EVENTSRC_ROOT_DIR", raising=False)
    cfg = write(tmp_path / "c.yaml", "rootDir: from-file\n")

    def root_of(*args: str, root: Path | None = None) -> str:
        return json.loads(run_cli("config", "print", *args, "-o", "json", root=root, check=True).stdout)["rootDir"]

    assert root_of() == "/var/lib/kubelet"
    assert root_of("--config", str(cfg)) == str(tmp_path / "from-file")
    assert root_of("--config", str(cfg), root=tmp_path / "from-flag") == str(tmp_path / "from-flag")
    monkeypatch.setenv("EVENTSRC_ROOT_DIR", str(tmp_path / "from-env"))
    assert root_of("--config", str(cfg)) == str(tmp_path / "from-env")


def test_the_example_starts_a_daemon(root: Path, daemon_factory) -> None:  # type: ignore[no-untyped-def]
    d = daemon_factory("--config", str(EXAMPLE))
    assert run_cli("status", root=root).returncode == 0
    assert d.stop() == 0
    records = [json.loads(line) for line in run_cli("log", "-o", "json", root=root, check=True).stdout.splitlines()]
    started = records[0]["event"]["config"]
    assert started["cpuManagerPolicy"] == "static" and started["topologyManagerPolicy"] == "best-effort"
    assert started["topologyFile"] == str(REPO / "examples" / "topology-256.json") and started["rootDir"] == str(root)
    cpu = next(r["event"] for r in records if r["type"] == "PolicyConfigurationChanged")
    assert cpu["new"]["reserved"] == "0-1" and cpu["new"]["options"] == {"full-pcpus-only": "true"}


def test_a_changed_configuration_is_recorded_once(root: Path, tmp_path: Path, daemon_factory) -> None:  # type: ignore[no-untyped-def]
    cfg = write(tmp_path / "c.yaml", "snapshotEvery: 100\n")
    assert daemon_factory("--config", str(cfg)).stop(signal.SIGTERM) == 0
    assert daemon_factory("--config", str(cfg)).stop() == 0  # the same: nothing to record
    write(cfg, "snapshotEvery: 200\nlogLevel: debug\n")
    d = daemon_factory("--config", str(cfg))
    assert d.stop() == 0
    assert 'msg="configuration changed" changed=logLevel,snapshotEvery' in d.output()
    assert daemon_factory("--config", str(cfg)).stop() == 0  # the same again
    # A flag is a change too; the file's other fields are kept.
    assert daemon_factory("--config", str(cfg), "--plugin-grace", "1m").stop() == 0
    records = [json.loads(line) for line in run_cli("log", "-o", "json", root=root, check=True).stdout.splitlines()]
    changes = [r["event"] for r in records if r["type"] == "ConfigurationChanged"]
    assert [c["changed"] for c in changes] == [["logLevel", "snapshotEvery"], ["pluginGracePeriod"]]
    first = changes[0]
    assert (first["old"]["snapshotEvery"], first["new"]["snapshotEvery"]) == (100, 200)
    assert (first["old"]["logLevel"], first["new"]["logLevel"]) == ("info", "debug")
    assert (changes[1]["old"]["pluginGracePeriod"], changes[1]["new"]["pluginGracePeriod"]) == ("5m0s", "1m0s")
    assert changes[1]["new"]["snapshotEvery"] == 200
    # Each is recorded with the start it belongs to (right after its DaemonStarted).
    types = [r["type"] for r in records]
    for i, t in enumerate(types):
        if t == "ConfigurationChanged":
            assert types[i - 1] == "DaemonStarted"
    state = json.loads(run_cli("state", "-o", "json", root=root, check=True).stdout)
    assert state["meta"]["config"]["pluginGracePeriod"] == "1m0s"
