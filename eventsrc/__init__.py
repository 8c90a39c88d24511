"""eventsrc: the kubelet's node resource managers on an append-only event log."""

__version__ = "0.1.0"
