"""Node name patterns in fleet files: `gpu-node-{0..11}`, `rack{1..2}-n{00..15}`, `gpu-node-*`.

Brace ranges expand like the shell's (`{0..11}`, zero-padded when written
`{00..11}`, or a list `{a,b}`), so a fleet file names a thousand nodes in one
line and a reader sees exactly which names exist. Override patterns may
also use shell globs (`*`, `?`, `[...]`) to pick nodes among the fleet's.
"""

import fnmatch
import re
from collections.abc import Iterable

_BRACE = re.compile(r"\{([^{}]*)\}")
_RANGE = re.compile(r"^(-?\d+)\.\.(-?\d+)$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_GLOB_CHARS = frozenset("*?[")
MAX_EXPANSION = 100_000
"""A pattern expanding to more names than this is a typo, not a fleet."""


class PatternError(ValueError):
    """A name pattern that cannot be expanded; the message says why."""


def _alternatives(body: str) -> list[str]:
    match = _RANGE.match(body)
    if match is None:
        if "," not in body:
            raise PatternError(f"'{{{body}}}' is neither a range like {{0..11}} nor a list like {{a,b}}")
        return body.split(",")
    first, last = match.group(1), match.group(2)
    start, stop = int(first), int(last)
    if stop < start:
        raise PatternError(f"range {{{body}}} runs backwards; write {{{last}..{first}}}")
    if stop - start + 1 > MAX_EXPANSION:
        raise PatternError(f"range {{{body}}} has more than {MAX_EXPANSION} names")
    padded = len(first) > 1 and first.startswith("0")
    width = max(len(first), len(last)) if padded else 0
    return [str(i).zfill(width) for i in range(start, stop + 1)]


def expand(pattern: str) -> list[str]:
    """Every name a brace pattern stands for, in order; a plain name stands for itself."""
    match = _BRACE.search(pattern)
    if match is None:
        if "{" in pattern or "}" in pattern:
            raise PatternError(f"unbalanced brace in {pattern!r}")
        return [pattern]
    head, tail = pattern[: match.start()], pattern[match.end() :]
    names: list[str] = []
    for alternative in _alternatives(match.group(1)):
        names.extend(expand(head + alternative + tail))
        if len(names) > MAX_EXPANSION:
            raise PatternError(f"{pattern!r} expands to more than {MAX_EXPANSION} names")
    return names


def is_glob(pattern: str) -> bool:
    return any(c in _GLOB_CHARS for c in pattern)


def select(pattern: str, names: Iterable[str]) -> list[str]:
    """The names among `names` that `pattern` (braces, then globs) picks, in `names` order."""
    expanded = expand(pattern)
    globs = [p for p in expanded if is_glob(p)]
    exact = {p for p in expanded if not is_glob(p)}
    return [n for n in names if n in exact or any(fnmatch.fnmatchcase(n, g) for g in globs)]


def invalid_node_name(name: str) -> str | None:
    """Why `name` cannot be a Node name (an RFC 1123 subdomain), or None when it can."""
    if len(name) > 253:
        return f"{name[:40]}... is longer than 253 characters"
    if not _DNS_SUBDOMAIN.match(name):
        return f"{name!r} is not a valid Node name (lower-case letters, digits, '-' and '.')"
    return None
