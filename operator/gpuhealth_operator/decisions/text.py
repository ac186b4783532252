"""Bounding and escaping the text the operator writes into conditions, Events and logs.

Condition and Event messages quote what the agent wrote into GPUNode status
(model names, UUIDs, recovery actions, ...): strings another process
controls. They are escaped so a newline or a control character cannot forge
a log line or hide text in `kubectl describe`, and cut to a documented size
(docs/conditions.md) so one huge string cannot make every status write fail
(the GPUNode CRD caps a condition message at 32768 characters) or flood the
Events. Both functions are deterministic, so the same facts always render the
same message and an unchanged condition is never rewritten.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable
from typing import Final

CONDITION_MESSAGE_MAX: Final = 4096
"""Characters of a GPUNode condition message (the CRD allows 32768)."""
NODE_CONDITION_MESSAGE_MAX: Final = 1024
"""Characters of the GPUHealthy condition message on the Node."""
EVENT_MESSAGE_MAX: Final = 1024
"""Characters of an Event message (what events.k8s.io/v1 allows for a note)."""

TRUNCATED: Final = "… (truncated)"
"""Ends a message that was cut to its size."""

_NAMED: Final = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
_UNSAFE_CATEGORIES: Final = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs", "Co", "Cn"})
"""Control, format (bidi, zero-width), line/paragraph separators, surrogate, private, unassigned."""


def escape(value: str) -> str:
    """`value` with every control or invisible formatting character written as an escape (`\\n`, `\\x1b`).

    Backslashes are kept as they are, so escaping twice changes nothing: a
    condition message that is quoted again in an Event stays readable.
    """
    if value.isprintable():
        return value
    return "".join(_escape_char(c) for c in value)


def bounded(value: str, limit: int) -> str:
    """`value` escaped, then cut to at most `limit` characters, ending in TRUNCATED when cut."""
    if limit < len(TRUNCATED):
        raise ValueError(f"limit {limit} is shorter than the truncation mark")
    text = escape(value)
    if len(text) <= limit:
        return text
    return text[: limit - len(TRUNCATED)] + TRUNCATED


def bounded_each(values: Iterable[str], limit: int) -> list[str]:
    """`bounded` of each value, in one call (a verdict's every condition message)."""
    return [bounded(value, limit) for value in values]


def _escape_char(char: str) -> str:
    if char in _NAMED:
        return _NAMED[char]
    if char == " " or unicodedata.category(char) not in _UNSAFE_CATEGORIES:
        return char
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"
