"""How the plugin's one I/O module turns API answers into the CLI's exit codes (no cluster needed)."""

import json
from typing import Any

import pytest
import urllib3.exceptions
from kubernetes import client

from gpuhealth_kubectl import cluster


def kube() -> cluster.Cluster:
    plain = object.__new__(cluster.Cluster)
    plain.server = "https://api.example:6443"
    return plain


def raising(error: BaseException) -> Any:
    def method(*_: Any, **__: Any) -> Any:
        raise error

    return method


def api_error(status: int, message: str) -> client.ApiException:
    error = client.ApiException(status=status, reason="Reason")
    error.body = json.dumps({"kind": "Status", "message": message})
    return error


@pytest.mark.parametrize(
    ("error", "expected", "text"),
    [
        (api_error(404, 'gpunodes "x" not found'), cluster.NotFound, 'gpunodes "x" not found'),
        (
            api_error(403, "forbidden: cannot patch"),
            cluster.ApiError,
            "the API server said 403: forbidden: cannot patch",
        ),
        (api_error(422, "spec.dryRun: Invalid value"), cluster.ApiError, "422: spec.dryRun: Invalid value"),
        (api_error(401, "Unauthorized"), cluster.Unreachable, "refused our credentials (401)"),
        (
            urllib3.exceptions.MaxRetryError(None, "/", reason="Connection refused"),  # type: ignore[arg-type]
            cluster.Unreachable,
            "cannot reach the API server at https://api.example:6443",
        ),
        (ConnectionResetError("reset by peer"), cluster.Unreachable, "reset by peer"),
    ],
)
def test_api_answers_become_the_right_error(
    error: BaseException, expected: type[Exception], text: str
) -> None:
    with pytest.raises(expected) as raised:
        kube()._call(raising(error))
    assert text in str(raised.value)
    assert "\n" not in str(raised.value)


def test_a_missing_gpunode_or_node_reads_as_none() -> None:
    plain = kube()
    plain._custom = type(
        "Custom", (), {"get_cluster_custom_object": staticmethod(raising(api_error(404, "nope")))}
    )()
    plain._core = type("Core", (), {"read_node": staticmethod(raising(api_error(404, "nope")))})()
    assert plain.gpunode("x") is None
    assert plain.node("x") is None
