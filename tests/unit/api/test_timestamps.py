"""One timestamp format on the wire: `gpuhealth_api.timestamps.render`, and every writer goes through it."""

from __future__ import annotations

import datetime
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuhealth_api import timestamps
from gpuhealth_operator.decisions import times

ROOT = Path(__file__).resolve().parents[3]
WIRE = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}Z$")
"""RFC 3339, UTC, `Z`, six fractional digits: what a Lease's MicroTime needs, and a valid metav1.Time."""

AT = datetime.datetime(2026, 11, 22, 1, 10, 14, 643000, tzinfo=datetime.UTC)


def test_the_format() -> None:
    assert timestamps.render(AT) == "2026-11-22T01:10:14.643000Z"
    assert timestamps.render(AT.replace(microsecond=0)) == "2026-11-22T01:10:14.000000Z"
    assert timestamps.render(AT.timestamp()) == "2026-11-22T01:10:14.643000Z"
    assert timestamps.rfc3339(AT.timestamp()) == timestamps.render(AT)


def test_an_offset_is_rendered_in_utc_and_a_naive_time_is_taken_as_utc() -> None:
    tokyo = AT.astimezone(datetime.timezone(datetime.timedelta(hours=9)))
    assert timestamps.render(tokyo) == timestamps.render(AT)
    assert timestamps.render(AT.replace(tzinfo=None)) == timestamps.render(AT)


def test_the_operator_renders_the_same() -> None:
    assert times.render(AT) == timestamps.render(AT)
    assert times.render(AT.replace(microsecond=0)) == timestamps.render(AT.replace(microsecond=0))


@given(
    st.datetimes(
        min_value=datetime.datetime(2000, 1, 1),
        max_value=datetime.datetime(2200, 1, 1),
        timezones=st.just(datetime.UTC),
    )
)
def test_every_datetime_round_trips_exactly_in_the_wire_format(moment: datetime.datetime) -> None:
    text = timestamps.render(moment)
    assert WIRE.match(text), text
    assert times.parse(text) == moment
    assert timestamps.parse(text) == moment.timestamp()


@pytest.mark.parametrize(
    "text", ["2026-11-22T01:10:14Z", "2026-11-22T01:10:14.643Z", "2026-11-22T02:10:14.643+01:00"]
)
def test_readers_accept_what_older_versions_and_kubectl_wrote(text: str) -> None:
    assert times.parse(text) is not None
    assert abs(timestamps.parse(text) - AT.timestamp()) < 1


# -- no second formatter ---------------------------------------------------------------------------------

FORMATTERS = re.compile(r"strftime\(|\.isoformat\(")
SCANNED = (
    "api/gpuhealth_api",
    "agent/gpuhealth_agent",
    "operator/gpuhealth_operator",
    "plugin/gpuhealth_kubectl",
    "sim/gpuhealth_sim",
)
SERVER_SIDE = "the in-memory API server's own metadata times, in seconds as a real one writes them (not ours)"
ALLOWED: dict[str, str] = {
    "api/gpuhealth_api/timestamps.py": "the one formatter",
    "sim/gpuhealth_sim/backtest/replayer.py": SERVER_SIDE,
    "sim/gpuhealth_sim/backtest/memcluster.py": SERVER_SIDE,
    "sim/gpuhealth_sim/backtest/tracegen.py": "the trace files' time format (milliseconds), input to "
    "replays whose reports must stay byte-identical; never written to a cluster",
    "sim/gpuhealth_sim/backtest/subcommands.py": "a file name's {start} (compact, no colons), "
    "not a timestamp",
}


def test_no_timestamp_is_formatted_outside_the_one_function() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for root in SCANNED
        for path in sorted((ROOT / root).rglob("*.py"))
        if path.relative_to(ROOT).as_posix() not in ALLOWED
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if FORMATTERS.search(line)
    ]
    assert found == [], "format timestamps with gpuhealth_api.timestamps.render:\n" + "\n".join(found)
