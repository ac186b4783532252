"""The gpu-health cluster operator: judges GPUNode facts against GPUHealthPolicy and acts.

Layers, outermost first (checked by import-linter): `handlers` (kopf) →
`actions` (Kubernetes I/O) → `decisions` (pure logic, no kopf, no client).
"""
