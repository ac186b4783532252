"""`helm test`: the release answers (run in the chart's image as the operator's ServiceAccount).

Both CRDs are served and readable, and, with leader election, an operator
replica holds the Lease and renewed it within three lease durations. Exit 0
when all hold; 1 with one line per failure otherwise.
"""

import datetime
import os
import sys

from kubernetes import client, config
from kubernetes.client.rest import ApiException

config.load_config()  # in-cluster in the test pod; KUBECONFIG elsewhere
namespace = os.environ["POD_NAMESPACE"]
lease_name = os.environ.get("LEASE_NAME", "")
failures = []
for plural in ("gpunodes", "gpuhealthpolicies"):
    try:
        client.CustomObjectsApi().list_cluster_custom_object("gpuhealth.io", "v1alpha1", plural, limit=1)
        print(f"ok: {plural}.gpuhealth.io served and readable")
    except ApiException as e:
        failures.append(f"{plural}.gpuhealth.io: HTTP {e.status} {e.reason}")
if lease_name:
    try:
        spec = client.CoordinationV1Api().read_namespaced_lease(lease_name, namespace).spec
    except ApiException as e:
        failures.append(f"Lease {lease_name}: HTTP {e.status} {e.reason} (has no operator replica started?)")
    else:
        now = datetime.datetime.now(datetime.UTC)
        limit = 3 * (spec.lease_duration_seconds or 15)
        age = (now - spec.renew_time).total_seconds() if spec.renew_time else None
        if not spec.holder_identity or age is None or age > limit:
            failures.append(
                f"Lease {lease_name}: holder {spec.holder_identity!r} not renewed in the last {limit} s"
                f" (last renewal {spec.renew_time}): is an operator replica Ready?"
            )
        else:
            print(f"ok: operator {spec.holder_identity} leads, renewed {age:.0f} s ago")
for failure in failures:
    print(f"FAIL: {failure}")
sys.exit(1 if failures else 0)
