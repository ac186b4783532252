"""hack/pass_stays.py, issue 46's measure of one node's pass: it reports its three cases' counts."""

import itertools
from pathlib import Path

import pytest

import hack_scripts

ROOT = Path(__file__).resolve().parents[4]


pass_stays = hack_scripts.load("pass_stays.py", "hack_pass_stays")


@pytest.mark.parametrize("case", pass_stays.CASES)
def test_each_case_reports_its_stays_modules_and_returns(case, capsys):
    assert pass_stays.main([case, "--trace"]) == 0
    lines = capsys.readouterr().out.splitlines()
    counts = lines[0].removeprefix(f"{case}: ").split(", ")
    assert [c.rsplit(" ", 1)[0] for c in counts] == [
        "stays",
        "modules",
        "returns to a module already visited",
        "least for its modules",
    ]
    stays, modules, returns, least = (int(c.rsplit(" ", 1)[1]) for c in counts)
    assert stays == modules + returns and modules > 1
    assert least == 2 * modules - 1 and stays >= least  # no pass stays fewer times than its modules allow
    sequence = [line.split()[1] for line in lines[1:]]
    assert len(sequence) == stays and sequence[0] == "runtime.passes"  # the pass begins and ends in run_one
    assert sequence[-1] == "runtime.passes"
    assert all(a != b for a, b in itertools.pairwise(sequence))  # a stay is maximal


def test_an_unknown_case_is_refused():
    with pytest.raises(ValueError, match="unknown case"):
        pass_stays.measure("rebooting")
