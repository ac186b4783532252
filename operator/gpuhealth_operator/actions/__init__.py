"""Kubernetes I/O of the operator: Node patches, drains, Events and status writes.

Each module performs one kind of write, minimal and idempotent, and returns
what the API server answered so the caller can refresh its view of the cluster.
Nothing here decides anything: the reconciler calls these after the decision
core has judged.
"""
