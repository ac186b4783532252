"""The XID catalogue: what each driver XID means and whether it is critical by default.

One list, as data (`xid_catalogue.yaml`, from NVIDIA's XID catalogue), read by
every program: the agent names an XID in its log and in `gpu-health-agent
check`, the operator's XidCritical rule acts on the catalogue's critical codes
when a policy lists no `xids`, and docs/conditions.md is generated from it. A
new driver's codes are a one-line change there, not an if-chain here.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.resources
from collections.abc import Mapping
from typing import Final

import yaml

UNKNOWN_ACTION: Final = "CONTACT_SUPPORT"
DATA_FILE: Final = "xid_catalogue.yaml"


@dataclasses.dataclass(frozen=True)
class XidInfo:
    code: int
    name: str
    description: str
    action: str
    """NVIDIA's immediate resolution bucket: RESTART_APP, RESET_GPU, RESTART_BM, ..."""
    critical: bool
    """A GPU reset, node reboot or worse is needed: XidCritical by default."""


class Catalogue:
    """XID code → meaning, loaded from the packaged YAML (or any mapping, for tests)."""

    def __init__(self, entries: Mapping[int, XidInfo]) -> None:
        self._entries = dict(entries)
        self.critical: frozenset[int] = frozenset(
            code for code, info in self._entries.items() if info.critical
        )
        """The codes that are critical by default."""

    @classmethod
    def packaged(cls) -> Catalogue:
        """The catalogue this release ships (read once per process)."""
        return _packaged()

    def lookup(self, code: int) -> XidInfo:
        found = self._entries.get(code)
        if found is not None:
            return found
        return XidInfo(code, f"XID_{code}", f"XID {code} (not in the catalogue)", UNKNOWN_ACTION, False)

    def entries(self) -> list[XidInfo]:
        """Every entry, ordered by code."""
        return [self._entries[code] for code in sorted(self._entries)]

    def __len__(self) -> int:
        return len(self._entries)


def parse(text: str) -> Catalogue:
    """A Catalogue from the YAML text; ValueError naming the entry when one is malformed."""
    data = yaml.safe_load(text)
    entries: dict[int, XidInfo] = {}
    for i, item in enumerate(data["xids"]):
        where = f"xids[{i}]"
        critical = item.get("critical")
        if not isinstance(critical, bool):
            raise ValueError(f"{where}.critical: must be true or false")
        code = int(item["code"])
        if code in entries:
            raise ValueError(f"{where}.code: duplicate XID {code}")
        entries[code] = XidInfo(
            code=code,
            name=str(item["name"]),
            description=str(item["description"]),
            action=str(item["action"]),
            critical=critical,
        )
    return Catalogue(entries)


@functools.cache
def _packaged() -> Catalogue:
    return parse(importlib.resources.files("gpuhealth_api").joinpath(DATA_FILE).read_text())


def default_critical() -> frozenset[int]:
    """The XIDs a policy's XidCritical rule acts on when it lists none: the catalogue's critical ones."""
    return Catalogue.packaged().critical
