"""Issue 28's acceptance item: a node disconnected from NATS for a while, with retention cutting,
ships everything once it reconnects; meanwhile status, the metrics and /healthz (200, with a
warning) say that shipping is disconnected and how far behind it is."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from eventsrc.layout import Layout
from eventsrc.log.store import EventLog
from tests.conftest import Daemon, run_cli
from tests.e2e.test_metrics import get, metrics_address, scrape, value
from tests.fleet.test_shipping import all_shipped_once, log_records
from tests.support.nats import NatsServer
from tests.support.node_client import NodeClient


def fleet(root: Path) -> dict[str, Any]:
    status = json.loads(run_cli("status", "-o", "json", root=root, check=True).stdout)
    return status["fleet"]  # type: ignore[no-any-return]


def live_first(root: Path) -> int:
    with EventLog(Layout(root).log, readonly=True) as log:
        return log.first_seq()


def test_a_node_away_from_nats_while_retention_cuts_ships_everything_once_it_is_back(
    root: Path, nats_server: NatsServer, daemon_factory: type[Daemon]
) -> None:
    daemon = daemon_factory(
        *("--fleet-nats", nats_server.url, "--node-name", "node-a"),
        *("--snapshot-every", "20", "--log-retention-max-size", "16Ki", "--metrics-address", "127.0.0.1:0"),
    )
    address = metrics_address(root)
    daemon.eventually(lambda: fleet(root)["state"] == "connected" and not fleet(root)["lag_records"], "shipped")
    assert get(f"http://{address}/healthz") == (200, "ok")

    nats_server.stop()
    with NodeClient(root) as client:
        client.remove(client.admit("cpu").uid)  # the shipper learns the server went, at the latest here
        away = daemon.eventually(lambda: (f := fleet(root))["state"] == "disconnected" and f, "shipping to go")
        assert away["lag_records"] > 0 and away["lag_seconds"] > 0

        def cut_unshipped() -> bool:
            for _ in range(10):  # the node goes on; its size bound cuts what was not shipped
                client.remove(client.admit("cpu").uid)
            return live_first(root) > fleet(root)["shipped_seq"] + 1

        daemon.eventually(cut_unshipped, "retention to cut records not shipped yet", timeout=120)
    text = run_cli("status", root=root)
    assert text.returncode == 0 and "running and ready" in text.stdout
    assert text.stderr.startswith("eventsrc: warning: fleet shipping is disconnected ("), text.stderr
    code, body = get(f"http://{address}/healthz")
    assert code == 200 and body.startswith("ok\nwarning: fleet shipping is disconnected ("), body
    _, _, samples = scrape(address)
    assert value(samples, "eventsrc_fleet_connected") == 0
    assert value(samples, "eventsrc_fleet_lag_records") > 0 and value(samples, "eventsrc_fleet_lag_seconds") > 0

    nats_server.start()
    # each record of the whole history (the archive's, then the live log's) once, in order
    daemon.eventually(lambda: all_shipped_once(root, nats_server.url), "everything shipped once the server is back")
    ours = log_records(root)
    assert [seq for seq, _ in ours] == list(range(1, len(ours) + 1))
    assert "the archive does not hold them" not in daemon.output()
    assert fleet(root)["state"] == "connected" and get(f"http://{address}/healthz") == (200, "ok")
    _, _, samples = scrape(address)
    assert value(samples, "eventsrc_fleet_connected") == 1
    assert value(samples, "eventsrc_fleet_shipped_sequence") == ours[-1][0]
    daemon.stop()
