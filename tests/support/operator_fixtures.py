"""The `operator` and `fleet` fixtures of the integration tests, written once.

A test module states how its operator runs and gets the fixture:

    operator = operator_fixtures.operator_fixture("drain-it")
    fleet = operator_fixtures.fleet_fixture("drain")

`operator` is `python -m gpuhealth_operator` against the session's API server (fixture `crds` unless
`plane` names another), leading a Lease of its own, stopped at the end of its scope with the tail of
its log printed (pytest shows it for a failed test). `fleet` is an `operator_harness.Fleet` whose
nodes carry a label unique to the test, cleaned up after it.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

import pytest
from kubernetes import client

import operator_harness
from gpuhealth_sim import waiting

Args = Sequence[str] | Callable[[pytest.FixtureRequest], Sequence[str]]


def operator_fixture(
    name: str,
    args: Args = operator_harness.QUICK_TIMER,
    *,
    scope: Literal["module", "function"] = "module",
    lead: bool = True,
    plane: str = "crds",
    api: str = "k8s",
    log_tail: int = 20000,
    before_stop: Callable[[operator_harness.OperatorProcess], None] | None = None,
) -> Any:
    """An `operator` fixture of `scope` for the module that assigns it.

    `args` are the operator's extra flags (default: a timer pass every 0.5 s and a short Lease), or a
    function of the fixture request returning them (to read other fixtures: a namespace, a label).
    Its Lease `gpu-health-operator-<name>-<random>` is its own, so a previous test's operator never
    holds it. With `lead` the fixture returns once the process leads. `before_stop` runs before the
    SIGTERM (e.g. to resume a process a test froze).
    """

    @pytest.fixture(scope=scope, name="operator")
    def operator(
        request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
    ) -> Iterator[operator_harness.OperatorProcess]:
        kubeconfig = Path(request.getfixturevalue(plane).kubeconfig)
        k8s: client.ApiClient = request.getfixturevalue(api)
        extra = list(args(request) if callable(args) else args)
        operator_harness.ensure_namespace(k8s, "gpu-health")
        suffix = secrets.token_hex(2)
        process = operator_harness.OperatorProcess(
            kubeconfig=kubeconfig,
            log_path=tmp_path_factory.mktemp("operator") / "operator.log",
            lease_name=f"gpu-health-operator-{name}-{suffix}",
            identity=f"{name}-{suffix}",
            extra_args=extra,
        ).start()
        try:
            if lead:
                waiting.wait_until(process.is_leading, timeout_seconds=30, message=f"operator {name} leads")
            yield process
        finally:
            if before_stop is not None:
                before_stop(process)
            process.stop()
            print(process.log()[-log_tail:])

    return operator


def label_for(prefix: str, request: pytest.FixtureRequest) -> str:
    """`<prefix>-<up to 20 characters of the test's name>-<random>`: a label value unique to the test."""
    test = re.sub(r"[^a-z0-9]+", "-", request.node.name.removeprefix("test_")[:20].lower()).strip("-")
    return f"{prefix}-{test}-{secrets.token_hex(2)}"


def fleet_fixture(prefix: str, *, api: str = "k8s") -> Any:
    """A `fleet` fixture (per test, after `operator`): an empty `operator_harness.Fleet` labelled
    `label_for(prefix)`; its nodes and policies are deleted after the test (and the operator's log
    printed if the test left it dead)."""

    @pytest.fixture(name="fleet")
    def fleet(
        request: pytest.FixtureRequest, operator: operator_harness.OperatorProcess
    ) -> Iterator[operator_harness.Fleet]:
        nodes = operator_harness.Fleet(request.getfixturevalue(api), label=label_for(prefix, request))
        try:
            yield nodes
        finally:
            if not operator.alive():
                print(operator.log()[-20000:])
            nodes.cleanup()

    return fleet
