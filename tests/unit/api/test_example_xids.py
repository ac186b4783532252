"""Examples that users copy must not state a default XID set the catalogue does not have."""

import re
from pathlib import Path

import pytest

from gpuhealth_api import xid_catalogue

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
DEFAULT_XIDS = re.compile(r"default XIDs?:\s*([\d ,]+)", re.IGNORECASE)


def _stated_defaults() -> list[tuple[str, frozenset[int]]]:
    stated = []
    for path in sorted(EXAMPLES.rglob("*.yaml")):
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if match := DEFAULT_XIDS.search(line):
                codes = frozenset(int(code) for code in re.findall(r"\d+", match.group(1)))
                stated.append((f"{path.relative_to(EXAMPLES)}:{number}", codes))
    return stated


@pytest.mark.parametrize(("where", "codes"), _stated_defaults() or [("(none)", None)])
def test_a_default_xid_set_stated_in_an_example_is_the_catalogues(
    where: str, codes: frozenset[int] | None
) -> None:
    if codes is None:
        return
    assert codes == xid_catalogue.default_critical(), f"{where}: not the catalogue's default XID set"
