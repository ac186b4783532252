"""A kubeconfig that cannot pick a server is said in one line that names the file."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuhealth_api import kubeconfig_check

GOOD = (
    "apiVersion: v1\nkind: Config\n"
    'clusters: [{name: c, cluster: {server: "https://127.0.0.1:6443"}}]\n'
    "users: [{name: u, user: {token: x}}]\n"
    "contexts: [{name: a, context: {cluster: c, user: u}}, {name: b, context: {cluster: gone, user: u}},"
    " {name: d, context: {cluster: c, user: nobody}}]\n"
    "current-context: a\n"
)


@pytest.mark.parametrize(
    ("content", "context", "said"),
    [
        (GOOD, None, None),
        (GOOD, "b", "context 'b' names cluster 'gone', which is not in clusters"),
        (GOOD, "d", "context 'd' names user 'nobody', which is not in users"),
        (GOOD, "x", "no context named 'x' (contexts: a, b, d)"),
        ("- a list\n", None, "not a kubeconfig (not a YAML mapping)"),
        ("apiVersion: v1\n", None, "no current-context set and no context given"),
        ("a: [\n", None, "not valid YAML (line 2, column 1: expected the node content"),
    ],
)
def test_problem(tmp_path: Path, content: str, context: str | None, said: str | None) -> None:
    path = tmp_path / "config"
    path.write_text(content)
    problem = kubeconfig_check.problem(path, context)
    if said is None:
        assert problem is None
    else:
        assert problem is not None and problem.startswith(f"kubeconfig {path}: ")
        assert said in problem and "\n" not in problem


def test_default_path_is_kubeconfigs_first_file() -> None:
    assert kubeconfig_check.default_path({"KUBECONFIG": "/a:/b"}) == Path("/a")
