"""What a healthy, idle GPU of each model reports in the simulation, when a scenario says nothing.

The fact table's defaults (`facts.py`) are an H100 SXM; `MODEL_FACTS`
adjusts them by the words of the model's name, from data-sheet figures, so
a simulated A100 is a PCIe Gen4 card with its own clocks and power limit.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

from gpuhealth_agent import facts

EXTRA_FACTS: Final[Mapping[str, Any]] = {
    "nvlinks": 18,
    "nvlinkLinksDown": 0,
    "nvlinkCrcErrors": 0,
    "nvlinkReplayErrors": 0,
    "nvlinkRecoveryErrors": 0,
    "fabricState": "NotSupported",
    "fabricStatus": "Success",
    "fabricCliqueId": 0,
    "pcieAerFatal": 0,
    "pcieAerNonFatal": 0,
    "pcieAerCorrectable": 0,
}
"""Scenario facts outside the fact table (NVLink, fabric, PCIe AER; see links.py, sysfs.py): an H100
SXM has 18 NVLinks; fabric info is NOT_SUPPORTED unless a scenario says otherwise (`fabricState`)."""
DEFAULT_FACTS: Final[Mapping[str, Any]] = {
    **{f.key: f.default for f in facts.FACTS if f.default is not None},
    **EXTRA_FACTS,
}
"""What a healthy, idle GPU reports when the scenario says nothing (an H100 SXM)."""

MODEL_FACTS: Final[tuple[tuple[frozenset[str], Mapping[str, Any]], ...]] = (
    # Every entry whose words all appear in the model name applies, in order (data-sheet
    # figures, rounded): an A100 scenario that says nothing about PCIe must not read as
    # a Gen5 card running at Gen4, nor an L4 as drawing 300 W of its 72 W.
    (
        frozenset({"A100"}),
        {
            "smClockMHz": 1410,
            "maxSmClockMHz": 1410,
            "powerWatts": 250.0,
            "powerLimitWatts": 400.0,
            "memoryTotalMiB": 81920,
            "pcieGeneration": 4,
            "pcieMaxGeneration": 4,
            "nvlinks": 12,
        },
    ),
    (frozenset({"A100", "PCIE"}), {"powerLimitWatts": 300.0, "nvlinks": 0}),
    (frozenset({"A100", "40GB"}), {"memoryTotalMiB": 40960}),
    (
        frozenset({"H100", "PCIE"}),
        {"smClockMHz": 1755, "maxSmClockMHz": 1755, "powerLimitWatts": 350.0, "nvlinks": 0},
    ),
    (
        frozenset({"H100", "NVL"}),
        {
            "smClockMHz": 1785,
            "maxSmClockMHz": 1785,
            "powerLimitWatts": 400.0,
            "memoryTotalMiB": 95830,
            "nvlinks": 0,  # PCIe cards; an NVLink bridge pairs them, which a scenario can say
        },
    ),
    (frozenset({"H200"}), {"memoryTotalMiB": 143771}),
    (
        frozenset({"L4"}),
        {
            "smClockMHz": 2040,
            "maxSmClockMHz": 2040,
            "powerWatts": 35.0,
            "powerLimitWatts": 72.0,
            "memoryTotalMiB": 23034,
            "pcieGeneration": 4,
            "pcieMaxGeneration": 4,
            "nvlinks": 0,
        },
    ),
    (
        frozenset({"L40S"}),
        {
            "smClockMHz": 2520,
            "maxSmClockMHz": 2520,
            "powerWatts": 100.0,
            "powerLimitWatts": 350.0,
            "memoryTotalMiB": 46068,
            "pcieGeneration": 4,
            "pcieMaxGeneration": 4,
            "nvlinks": 0,
        },
    ),
)


def defaults_for(model: str) -> dict[str, Any]:
    """DEFAULT_FACTS adjusted to a GPU model the simulation knows (by the words of its name)."""
    words = set(re.split(r"[\s\-_]+", model.upper()))
    facts = dict(DEFAULT_FACTS)
    for needed, overrides in MODEL_FACTS:
        if needed <= words:
            facts.update(overrides)
    return facts
