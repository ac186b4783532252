"""What a request to the API server can fail with, and which of those the next pass tries again."""

from __future__ import annotations

import asyncio

import aiohttp


class ApiError(Exception):
    """A non-2xx answer of the API server."""

    def __init__(self, status: int, reason: str, body: str) -> None:
        super().__init__(f"{status} {reason}: {body[:500]}")
        self.status = status
        self.reason = reason
        self.body = body

    @property
    def not_found(self) -> bool:
        return self.status == 404

    @property
    def conflict(self) -> bool:
        return self.status == 409


TRANSIENT_ERRORS = (ApiError, aiohttp.ClientError, OSError, asyncio.TimeoutError)
"""What a request can fail with that the next pass tries again: the API server's refusal, the connection."""


class NotLeading(ApiError):
    """A write refused before it was sent: this replica's leader term does not allow writes now."""

    def __init__(self, method: str, path: str) -> None:
        super().__init__(0, "NotLeading", f"{method} {path} not sent: this replica no longer leads")
