"""eventsrc's testbed: what the tests and the developers run around eventsrc, never shipped with it.

- ``servers/``: the tests' real servers, fetched from Debian's archive into a cache and run by
  pid: containerd (``containerd.py``), nats-server (``nats_server.py``), PostgreSQL
  (``postgres_server.py``), the fetch (``debian_packages.py``) and a server process's start,
  stop and log (``server_process.py``).
- ``benches/``: the developers' benches. ``eventsrc bench scale|watch|soak|nri|fleet`` run them
  (``commands.py``, found through the ``eventsrc.benches`` entry points); ``grpc_bridge``,
  ``kubelet_files`` and ``sink_store`` are run with ``python -m testbed.benches.NAME``.

eventsrc never imports it (an import-linter contract, docs/adr/0014).
"""
