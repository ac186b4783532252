"""What is wrong with a kubeconfig file, in one line that names the file: for every command's exit 2.

The Kubernetes client's loader says "Invalid kube-config file. No configuration
found." for a missing file (not which one) and a YAML error over three lines;
the operator's own reader raised a traceback. Every command (agent, operator,
simulator) checks the file here first and prints `problem`'s line instead.
Only the structure that picks the server is checked (the context, its
cluster and user); credentials are the loader's business.
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Mapping
from typing import Any

import yaml


def default_path(env: Mapping[str, str] = os.environ) -> pathlib.Path:
    """$KUBECONFIG's first file, else ~/.kube/config (where the client's loader looks)."""
    listed = [p for p in env.get("KUBECONFIG", "").split(os.pathsep) if p]
    return pathlib.Path(listed[0]) if listed else pathlib.Path.home() / ".kube" / "config"


def yaml_error(error: yaml.YAMLError) -> str:
    """`not valid YAML (line 3, column 3: expected the node content, but found '-')`, on one line."""
    mark = getattr(error, "problem_mark", None)
    problem = getattr(error, "problem", None) or str(error).splitlines()[0]
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    return f"not valid YAML ({where}{problem})"


def one_line(text: object) -> str:
    """An exception's text on one line (the client's messages span several)."""
    return " ".join(str(text).split())


def problem(path: pathlib.Path | str, context: str | None = None) -> str | None:
    """`kubeconfig PATH: what is wrong`, or None when the file picks a cluster and a user."""
    path = pathlib.Path(path)
    said = f"kubeconfig {path}"
    try:
        text = path.read_text()
    except FileNotFoundError:
        return f"{said}: no such file"
    except OSError as error:
        return f"{said}: cannot read it: {error.strerror or error}"
    try:
        config = yaml.safe_load(text)
    except yaml.YAMLError as error:
        return f"{said}: {yaml_error(error)}"
    if not isinstance(config, dict):
        return f"{said}: not a kubeconfig (not a YAML mapping)"
    name = context or config.get("current-context")
    if not name:
        return f"{said}: no current-context set and no context given"
    found = _named(config, "contexts", "context", name)
    if found is None:
        known = ", ".join(_names(config, "contexts")) or "none"
        return f"{said}: no context named {name!r} (contexts: {known})"
    cluster = found.get("cluster")
    if _named(config, "clusters", "cluster", cluster) is None:
        return f"{said}: context {name!r} names cluster {cluster!r}, which is not in clusters"
    user = found.get("user")
    if user and _named(config, "users", "user", user) is None:
        return f"{said}: context {name!r} names user {user!r}, which is not in users"
    return None


def _names(config: Mapping[str, Any], section: str) -> list[str]:
    items = config.get(section)
    return [str(i.get("name")) for i in items or [] if isinstance(i, dict)] if isinstance(items, list) else []


def _named(config: Mapping[str, Any], section: str, field: str, name: object) -> dict[str, Any] | None:
    items = config.get(section)
    for item in items if isinstance(items, list) else []:
        if isinstance(item, dict) and item.get("name") == name and isinstance(item.get(field), dict):
            found: dict[str, Any] = item[field]
            return found
    return None
