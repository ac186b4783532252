"""What the API server says it answered, from its own /metrics (`apiserver_request_total`): a test that
proves the operator does not read something over and over counts the requests there, every client's."""

from __future__ import annotations

import re

from kubernetes import client


def pod_lists(k8s: client.ApiClient) -> float:
    """LIST requests for pods across all namespaces the API server has answered (since it started)."""
    method, url, headers, *_ = k8s.param_serialize("GET", "/metrics", auth_settings=["BearerToken"])
    response = k8s.call_api(method, url, header_params=headers)
    response.read()
    metrics = response.data.decode()
    series = re.findall(r"^apiserver_request_total\{([^}]*)\} (\S+)$", metrics, re.M)
    wanted = ('resource="pods"', 'verb="LIST"', 'scope="cluster"', 'subresource=""')
    return sum(float(value) for labels, value in series if all(w in labels for w in wanted))
