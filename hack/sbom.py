#!/usr/bin/env python3
"""A CycloneDX 1.5 JSON SBOM of a gpu-health wheel: the wheel and every distribution it pulls in.

    python hack/sbom.py dist/gpu_health-X.Y.Z-py3-none-any.whl > dist/gpu-health-X.Y.Z.cdx.json

The wheel's own `Requires-Dist` (markers evaluated for this Python, no extras) is walked through the
environment this Python runs in, which must have the wheel's dependencies installed (`make venv` does;
so does `pip install` of the wheel): each component is the version actually installed, with its
Package URL and licence as its metadata declares them. No SBOM tool is needed (cyclonedx-bom would
do as well; `cyclonedx-py environment` over a clean venv with the wheel gives the same components).
Deterministic for one environment: components sorted, the timestamp is the wheel's mtime (or
SOURCE_DATE_EPOCH).
"""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import os
import sys
import uuid
import zipfile
from email.parser import HeaderParser
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

NAMESPACE = uuid.UUID("6f1e3c1c-9a49-4b63-9d7c-6a2b8c3d4e5f")
"""serialNumber = uuid5(NAMESPACE, name==version): the same release, the same serial number."""


def wheel_metadata(wheel: Path) -> Any:
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        return HeaderParser().parsestr(archive.read(name).decode())


def _needed(requirements: list[str] | None) -> list[Requirement]:
    needed = []
    for line in requirements or []:
        requirement = Requirement(line)
        # No extras: the wheel as installed by `pip install gpu-health` (markers with `extra` are false).
        if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
            needed.append(requirement)
    return needed


def _licence(metadata: Any) -> list[dict[str, Any]]:
    if expression := metadata.get("License-Expression"):
        return [{"expression": expression}]
    text = (metadata.get("License") or "").strip()
    if text and "\n" not in text and len(text) < 100:
        return [{"license": {"name": text}}]
    classifiers = [
        c.split(" :: ")[-1] for c in metadata.get_all("Classifier") or [] if c.startswith("License ::")
    ]
    return [{"license": {"name": name}} for name in classifiers]


def _component(name: str, version: str, metadata: Any) -> dict[str, Any]:
    component: dict[str, Any] = {
        "type": "library",
        "bom-ref": f"pkg:pypi/{name}@{version}",
        "name": name,
        "version": version,
        "purl": f"pkg:pypi/{name}@{version}",
    }
    if licences := _licence(metadata):
        component["licenses"] = licences
    return component


def build(wheel: Path) -> dict[str, Any]:
    root = wheel_metadata(wheel)
    root_name, root_version = canonicalize_name(root["Name"]), root["Version"]
    root_ref = f"pkg:pypi/{root_name}@{root_version}"
    components: dict[str, dict[str, Any]] = {}
    depends: dict[str, set[str]] = {root_ref: set()}
    queue = [(root_ref, requirement) for requirement in _needed(root.get_all("Requires-Dist"))]
    missing = []
    while queue:
        parent, requirement = queue.pop()
        name = canonicalize_name(requirement.name)
        try:
            installed = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            missing.append(f"{requirement} (needed by {parent})")
            continue
        ref = f"pkg:pypi/{name}@{installed.version}"
        depends[parent].add(ref)
        if ref in components:
            continue
        components[ref] = _component(name, installed.version, installed.metadata)
        depends[ref] = set()
        queue += [(ref, r) for r in _needed(installed.requires)]
    if missing:
        raise SystemExit("not installed in this environment: " + "; ".join(sorted(missing)))
    epoch = int(os.environ.get("SOURCE_DATE_EPOCH") or wheel.stat().st_mtime)
    stamp = datetime.datetime.fromtimestamp(epoch, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "bomFormat": "CycloneDX",
        "specVersion": "1.5",
        "serialNumber": f"urn:uuid:{uuid.uuid5(NAMESPACE, f'{root_name}=={root_version}')}",
        "version": 1,
        "metadata": {
            "timestamp": stamp,
            "tools": {"components": [{"type": "application", "name": "gpu-health hack/sbom.py"}]},
            "component": {
                "type": "application",
                "bom-ref": root_ref,
                "name": root_name,
                "version": root_version,
                "purl": root_ref,
                "licenses": _licence(root),
            },
        },
        "components": [components[ref] for ref in sorted(components)],
        "dependencies": [{"ref": ref, "dependsOn": sorted(on)} for ref, on in sorted(depends.items())],
    }


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not argv[0].endswith(".whl"):
        print(__doc__, file=sys.stderr)
        return 2
    json.dump(build(Path(argv[0])), sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
