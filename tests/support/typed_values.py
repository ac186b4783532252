"""Values compared with their types, for tests of what the cache shares (1 and True are equal in Python)."""

from __future__ import annotations


def typed(value: object) -> object:
    """`value` with the type of everything in it, so that 1 and True (or 1.0) compare unequal."""
    if isinstance(value, list):
        return [typed(v) for v in value]
    if hasattr(value, "items"):
        return sorted((k, typed(v)) for k, v in value.items())
    return (type(value).__name__, value)
