"""The gpu-health cluster operator: judges GPUNode facts against GPUHealthPolicy and acts.

Packages, outermost first (checked by import-linter, drawn in docs/architecture.md): `runtime`
(watches, handlers, passes, timer) → `ladder` (one sub-package per step) → `verdict` → `shared` →
`client` (Kubernetes I/O) → `state` → `decisions` (pure logic, no kopf, no client) → `compact`.
"""

import sys


def _import_kopf_without_the_kubernetes_client() -> None:
    """Import kopf while `kubernetes` cannot be imported, unless something imported either already.

    kopf imports the Kubernetes client at its own import when the package is installed (it is a
    dependency of this distribution), to recognise the client's model objects: ~250 generated
    classes, ~40 MiB, more than the operator's whole cache at 1,000 nodes. The operator talks to
    the API server through `kube` and never hands kopf such an object; kopf falls back to plain
    dicts, as it does where the package is absent. Afterwards `kubernetes` imports normally.
    """
    if "kopf" in sys.modules or "kubernetes" in sys.modules:
        return
    sys.modules["kubernetes"] = None  # type: ignore[assignment]  # ImportError for kopf's `try: import`
    try:
        import kopf  # noqa: F401, PLC0415
    finally:
        del sys.modules["kubernetes"]


_import_kopf_without_the_kubernetes_client()
