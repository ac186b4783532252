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
    plain.sleep = lambda _: None
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


class Answers:
    """A client method that answers with each of `answers` in turn (an exception is raised)."""

    def __init__(self, *answers: Any) -> None:
        self.answers = list(answers)
        self.calls = 0

    def __call__(self, *_: Any, **__: Any) -> Any:
        self.calls += 1
        answer = self.answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer


class Response:
    data = b'{"items": []}'


def test_a_busy_server_is_asked_again_as_retry_after_says() -> None:
    """A CRD just established answers 429 "storage is (re)initializing" for a moment."""
    plain = kube()
    waits: list[float] = []
    plain.sleep = waits.append
    busy = api_error(429, "storage is (re)initializing")
    busy.headers = {"Retry-After": "1"}
    method = Answers(busy, busy, Response())
    assert plain._call(method) == {"items": []}
    assert method.calls == 3 and waits == [1.0, 1.0]

    always = Answers(*[busy] * (cluster.RETRIES_429 + 1))
    with pytest.raises(cluster.ApiError, match="429: storage is"):
        plain._call(always)
    assert always.calls == cluster.RETRIES_429 + 1
