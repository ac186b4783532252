"""The gpu-health cluster operator: judges GPUNode facts against GPUHealthPolicy and acts.

Packages, outermost first (checked by import-linter, docs/architecture.md): `runtime` (kopf, watches,
passes, timer) → `ladder` (one sub-package per step) → `verdict` → `shared` (the context) → `client`
(Kubernetes I/O) → `state` (the cache) → `decisions` (pure logic, no kopf, no client) → `compact`.
Importing this package imports nothing else: the kubectl plugin and the simulator take the pure
`decisions` without kopf.
"""
