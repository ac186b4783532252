"""Facts the kernel shows in sysfs: PCIe AER counts per GPU and InfiniBand/RoCE ports per node.

Read from a root directory (`/sys` in production, the chart mounting
`/sys/bus/pci/devices` and `/sys/class/infiniband` read-only; a temporary
tree in tests and in the simulated backend, which writes the same files the
kernel would, so one reader serves both). A file that is missing or cannot
be read leaves its field absent: no AER support, no InfiniBand, a container
without the mount all mean "not known", never zero.

- `gpus[].pcie.aer {fatal, nonFatal, correctable}`: the `TOTAL_ERR_*` line of
  `bus/pci/devices/<domain:bus:dev.fn>/aer_dev_{fatal,nonfatal,correctable}`
  (counts since boot, per PCI function).
- `status.nics[] {name, port, state, physState, rateGbps, linkDowned,
  symbolErrors, rcvErrors}`: `class/infiniband/<name>/ports/<port>/` `state`
  ("4: ACTIVE"), `phys_state` ("5: LinkUp"), `rate` ("400 Gb/sec (4X NDR)")
  and `counters/{link_downed,symbol_error,port_rcv_errors}`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Final

from gpuhealth_api import status

DEFAULT_ROOT: Final = "/sys"
PCI_DEVICES: Final = ("bus", "pci", "devices")
INFINIBAND: Final = ("class", "infiniband")
AER_FILES: Final[tuple[tuple[str, str], ...]] = (
    ("fatal", "aer_dev_fatal"),
    ("nonFatal", "aer_dev_nonfatal"),
    ("correctable", "aer_dev_correctable"),
)
"""`pcie.aer` key and the sysfs file whose TOTAL_ERR_* line holds it."""
NIC_COUNTERS: Final[tuple[tuple[str, str], ...]] = (
    ("linkDowned", "link_downed"),
    ("symbolErrors", "symbol_error"),
    ("rcvErrors", "port_rcv_errors"),
)
"""`nics[]` counter key and its file under the port's `counters/`."""
MAX_NICS: Final = 64
"""Ports reported at most (a node has a handful; bounds the status and the metrics)."""

_BUS_ID = re.compile(r"^(?:([0-9a-fA-F]+):)?([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])$")
_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*Gb/sec")


def sysfs_bus_id(pci_bus_id: str) -> str | None:
    """NVML's `00000000:18:00.0` as sysfs names it, `0000:18:00.0`; None if it is not a bus id."""
    match = _BUS_ID.match(pci_bus_id.strip())
    if match is None:
        return None
    domain, bus, device, function = match.groups()
    return f"{int(domain or '0', 16):04x}:{bus.lower()}:{device.lower()}.{function}"


def _read(path: Path) -> str | None:
    try:
        with open(path, "rb") as file:  # noqa: PTH123 - a fifth of Path.read_text's cost, read every second
            return file.read(4096).decode()
    except (OSError, UnicodeDecodeError):
        return None


def _total(text: str) -> int | None:
    """The count on the `TOTAL_ERR_...` line of an aer_dev_* file."""
    for line in text.splitlines():
        name, _, count = line.strip().partition(" ")
        if name.startswith("TOTAL_ERR_"):
            try:
                return int(count.strip())
            except ValueError:
                return None
    return None


def read_aer(root: Path, pci_bus_id: str) -> status.PcieAer | None:
    """The GPU's AER totals, or None where the kernel shows none (no AER, no such device, no mount)."""
    name = sysfs_bus_id(pci_bus_id)
    if name is None:
        return None
    device = root.joinpath(*PCI_DEVICES, name)
    found = status.PcieAer()
    for key, filename in AER_FILES:
        text = _read(device / filename)
        count = None if text is None else _total(text)
        if count is not None:
            found[key] = count  # type: ignore[literal-required]
    return found or None


def _named(text: str | None) -> str | None:
    """`4: ACTIVE` → `ACTIVE`, `5: LinkUp` → `LinkUp`."""
    if text is None:
        return None
    value = text.strip().partition(":")[2].strip() or text.strip()
    return value or None


def _int(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        return int(text.strip())
    except ValueError:
        return None


def rate_gbps(text: str | None) -> float | None:
    """`400 Gb/sec (4X NDR)` → 400.0."""
    match = None if text is None else _RATE.match(text)
    return None if match is None else float(match.group(1))


def read_port(port_dir: Path, name: str, port: int) -> status.Nic:
    nic = status.Nic(name=name, port=port)
    state = _named(_read(port_dir / "state"))
    if state is not None:
        nic["state"] = state
    phys = _named(_read(port_dir / "phys_state"))
    if phys is not None:
        nic["physState"] = phys
    rate = rate_gbps(_read(port_dir / "rate"))
    if rate is not None:
        nic["rateGbps"] = rate
    for key, filename in NIC_COUNTERS:
        count = _int(_read(port_dir / "counters" / filename))
        if count is not None:
            nic[key] = count  # type: ignore[literal-required]
    return nic


def _ports(root: Path) -> list[tuple[Path, str, int]] | None:
    """Every port directory with its device and number, sorted; None without /sys/class/infiniband."""
    base = root.joinpath(*INFINIBAND)
    try:
        devices = sorted(base.iterdir())
    except OSError:
        return None
    found: list[tuple[Path, str, int]] = []
    for device in devices:
        try:
            ports = sorted(
                (p for p in (device / "ports").iterdir() if p.name.isdigit()), key=lambda p: int(p.name)
            )
        except OSError:
            continue
        found += [(port_dir, device.name, int(port_dir.name)) for port_dir in ports]
    return found[:MAX_NICS]


def read_nics(root: Path) -> list[status.Nic] | None:
    """Every InfiniBand/RoCE port, sorted by device and port; None without /sys/class/infiniband."""
    ports = _ports(root)
    return None if ports is None else [read_port(port_dir, name, port) for port_dir, name, port in ports]


class NicReader:
    """The node's ports, cheaply: the port list and every file on full reads, only `state` in between.

    A port going down shows in its logical state at the next sample; the physical state, rate and
    counters (judged over minutes) can wait for the next full read (the collector's slow tier). A
    node has a handful of ports: reading six files of each every second cost the agent more CPU
    than all of NVML.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self._ports: list[tuple[Path, str, int]] = []
        self._last: list[status.Nic] | None = None

    def read(self, full: bool) -> list[status.Nic] | None:
        if full or self._last is None:
            ports = _ports(self.root)
            self._ports = ports or []
            self._last = None if ports is None else [read_port(p, name, port) for p, name, port in ports]
            return self._last
        nics = []
        for (port_dir, _, _), last in zip(self._ports, self._last, strict=True):
            nic = status.Nic(**last)
            state = _named(_read(port_dir / "state"))
            if state is None:
                nic.pop("state", None)
            else:
                nic["state"] = state
            nics.append(nic)
        self._last = nics
        return nics
