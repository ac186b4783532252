"""Agent-supplied strings are escaped and messages cut to their documented size."""

import pytest

from gpuhealth_operator.decisions import text


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3"),
        ("GpuReset\nNode n2: NodeDrained", "GpuReset\\nNode n2: NodeDrained"),
        ("a\r\tb", "a\\r\\tb"),
        ("\x1b[31mred\x1b[0m", "\\x1b[31mred\\x1b[0m"),
        ("\x00\x7f", "\\x00\\x7f"),
        ("left\u202eright", "left\\u202eright"),  # a bidi override reorders what kubectl shows
        ("line\u2028sep", "line\\u2028sep"),
        ("zero\u200bwidth", "zero\\u200bwidth"),
        ("30 °C ≥ 25 °C…", "30 °C ≥ 25 °C…"),
        ("back\\slash", "back\\slash"),
    ],
)
def test_escape_writes_control_and_invisible_characters_as_escapes(raw: str, shown: str) -> None:
    assert text.escape(raw) == shown


def test_escaping_twice_changes_nothing() -> None:
    once = text.escape("GpuReset\n\x1b\u202e")
    assert text.escape(once) == once


def test_a_short_message_is_kept_whole() -> None:
    assert text.bounded("GPU 3: 1 uncorrectable volatile ECC error", 1024) == (
        "GPU 3: 1 uncorrectable volatile ECC error"
    )


def test_a_long_message_is_cut_to_the_limit_and_says_so() -> None:
    message = "GPU 0: " + "x" * 36_000
    cut = text.bounded(message, text.CONDITION_MESSAGE_MAX)
    assert len(cut) == text.CONDITION_MESSAGE_MAX
    assert cut.startswith("GPU 0: xxx")
    assert cut.endswith(text.TRUNCATED)


def test_a_message_exactly_at_the_limit_is_not_marked() -> None:
    assert text.bounded("x" * 1024, 1024) == "x" * 1024


def test_the_limit_counts_escaped_characters() -> None:
    cut = text.bounded("\n" * 600, 1024)
    assert len(cut) == 1024
    assert "\n" not in cut
    assert cut.endswith(text.TRUNCATED)


def test_cutting_is_deterministic() -> None:
    message = "; ".join(f"GPU {i}: driver asks for recovery action {'y' * 700}" for i in range(64))
    assert text.bounded(message, 4096) == text.bounded(message, 4096)


def test_a_limit_shorter_than_the_mark_is_refused() -> None:
    with pytest.raises(ValueError, match="limit"):
        text.bounded("anything", 3)
