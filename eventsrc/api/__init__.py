"""Edges to clients: the node API and the PodResources server."""
