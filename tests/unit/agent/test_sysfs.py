"""The sysfs readers: PCIe AER per GPU and InfiniBand/RoCE ports, on a fake tree in tmp_path."""

from pathlib import Path

import pytest

from gpuhealth_agent import sysfs

AER_FATAL = """Undefined 0
DLP 0
SDES 0
TLP 0
FCP 0
CmpltTO 0
CmpltAbrt 0
UnxCmplt 0
RxOF 0
MalfTLP 0
ECRC 0
UnsupReq 0
ACSViol 0
UncorrIntErr 1
BlockedTLP 0
AtomicOpBlocked 0
TLPBlockedErr 0
PoisonTLPBlocked 0
TOTAL_ERR_FATAL 1
"""
AER_CORRECTABLE = """RxErr 3
BadTLP 0
BadDLLP 2
Rollover 0
Timeout 0
NonFatalErr 0
CorrIntErr 0
HeaderOF 0
TOTAL_ERR_COR 5
"""


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def device(root: Path, name: str = "0000:18:00.0") -> Path:
    return root / "bus" / "pci" / "devices" / name


def port(root: Path, nic: str, number: int) -> Path:
    return root / "class" / "infiniband" / nic / "ports" / str(number)


@pytest.mark.parametrize(
    ("nvml", "kernel"),
    [
        ("00000000:18:00.0", "0000:18:00.0"),
        ("00000001:AB:00.0", "0001:ab:00.0"),
        ("0000:9A:00.1", "0000:9a:00.1"),
        ("9A:00.0", "0000:9a:00.0"),
        ("not a bus id", None),
    ],
)
def test_nvml_bus_ids_name_the_sysfs_device(nvml: str, kernel: str | None) -> None:
    assert sysfs.sysfs_bus_id(nvml) == kernel


def test_aer_reads_the_total_line_of_each_file(tmp_path: Path) -> None:
    write(device(tmp_path) / "aer_dev_fatal", AER_FATAL)
    write(device(tmp_path) / "aer_dev_nonfatal", "Undefined 0\nTOTAL_ERR_NONFATAL 2\n")
    write(device(tmp_path) / "aer_dev_correctable", AER_CORRECTABLE)
    assert sysfs.read_aer(tmp_path, "00000000:18:00.0") == {"fatal": 1, "nonFatal": 2, "correctable": 5}


def test_no_aer_files_is_absent_not_zero(tmp_path: Path) -> None:
    device(tmp_path).mkdir(parents=True)
    assert sysfs.read_aer(tmp_path, "00000000:18:00.0") is None
    assert sysfs.read_aer(tmp_path / "no-such-root", "00000000:18:00.0") is None


def test_a_missing_or_garbled_aer_file_leaves_only_its_count_absent(tmp_path: Path) -> None:
    write(device(tmp_path) / "aer_dev_fatal", "TOTAL_ERR_FATAL 0\n")
    write(device(tmp_path) / "aer_dev_nonfatal", "TOTAL_ERR_NONFATAL many\n")
    assert sysfs.read_aer(tmp_path, "00000000:18:00.0") == {"fatal": 0}


def make_port(root: Path, nic: str, number: int, state: str = "4: ACTIVE", counters: bool = True) -> None:
    where = port(root, nic, number)
    write(where / "state", state + "\n")
    write(where / "phys_state", "5: LinkUp\n")
    write(where / "rate", "400 Gb/sec (4X NDR)\n")
    if counters:
        write(where / "counters" / "link_downed", "1\n")
        write(where / "counters" / "symbol_error", "7\n")
        write(where / "counters" / "port_rcv_errors", "0\n")


def test_nics_read_every_port_of_every_device_in_order(tmp_path: Path) -> None:
    make_port(tmp_path, "mlx5_1", 1, state="1: DOWN")
    make_port(tmp_path, "mlx5_0", 2)
    make_port(tmp_path, "mlx5_0", 1, counters=False)
    nics = sysfs.read_nics(tmp_path)
    assert nics == [
        {"name": "mlx5_0", "port": 1, "state": "ACTIVE", "physState": "LinkUp", "rateGbps": 400.0},
        {
            "name": "mlx5_0",
            "port": 2,
            "state": "ACTIVE",
            "physState": "LinkUp",
            "rateGbps": 400.0,
            "linkDowned": 1,
            "symbolErrors": 7,
            "rcvErrors": 0,
        },
        {
            "name": "mlx5_1",
            "port": 1,
            "state": "DOWN",
            "physState": "LinkUp",
            "rateGbps": 400.0,
            "linkDowned": 1,
            "symbolErrors": 7,
            "rcvErrors": 0,
        },
    ]


def test_no_infiniband_class_is_no_nics_field(tmp_path: Path) -> None:
    assert sysfs.read_nics(tmp_path) is None
    (tmp_path / "class" / "infiniband").mkdir(parents=True)
    assert sysfs.read_nics(tmp_path) == []


@pytest.mark.parametrize(
    ("text", "gbps"),
    [
        ("400 Gb/sec (4X NDR)", 400.0),
        ("200 Gb/sec (4X HDR)\n", 200.0),
        ("2.5 Gb/sec (1X SDR)", 2.5),
        ("garbage", None),
        (None, None),
    ],
)
def test_rate_text_is_gbps(text: str | None, gbps: float | None) -> None:
    assert sysfs.rate_gbps(text) == gbps
