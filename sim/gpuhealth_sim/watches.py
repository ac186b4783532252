"""Follow a Kubernetes collection from a thread: list, then watch, and say when each change arrived.

The demo measures detection-to-action times from what it sees, so each
change is handed over with the wall-clock time it arrived (a poll would
blur that by its period). Watches are re-opened every few seconds
(server-side timeout) so `stop()` returns promptly, resume from the last
resourceVersion, and fall back to a fresh list when that has expired (410).
An object deleted while no watch was open is missing from that list: it is
handed over as DELETED then (its name and namespace only), as an informer
does, so a follower never keeps a deleted object. Objects stay plain dicts:
the view reads a few fields and needs no models.
"""

import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from kubernetes import client, watch

log = logging.getLogger(__name__)

Handler = Callable[[str, dict[str, Any], float], object]
"""Called with (ADDED | MODIFIED | DELETED, the object, arrival time in epoch seconds)."""
Lister = Callable[..., Any]

WATCH_TIMEOUT_SECONDS = 2
RETRY_SECONDS = 1.0
GONE = 410


class Follower:
    """A daemon thread that keeps `handler` told about every object `lister` lists."""

    def __init__(self, name: str, lister: Lister, handler: Handler, **list_kwargs: Any) -> None:
        self.name = name
        self._lister = lister
        self._handler = handler
        self._kwargs = list_kwargs
        self._stopped = threading.Event()
        self._synced = threading.Event()
        self._known: set[tuple[str, str]] = set()
        """(namespace, name) of every object handed over and not deleted since."""
        self._thread = threading.Thread(target=self._run, name=f"follow-{name}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def request_stop(self) -> None:
        """Ask the thread to stop after its current watch (at most WATCH_TIMEOUT_SECONDS)."""
        self._stopped.set()

    def stop(self) -> None:
        self.request_stop()
        self._thread.join(timeout=WATCH_TIMEOUT_SECONDS + 5)

    @property
    def synced(self) -> bool:
        """Whether the first list has been handed over (a handler called before that gets listed objects)."""
        return self._synced.is_set()

    def wait_synced(self, timeout_seconds: float) -> bool:
        """True once the first list has been handed over."""
        return self._synced.wait(timeout_seconds)

    def _list(self) -> str:
        response = self._lister(**self._kwargs, _preload_content=False)
        try:
            body = _json(response)
        finally:
            response.release_conn()
        now = time.time()
        items = body.get("items") or []
        listed = {_key(item) for item in items}
        for namespace, name in sorted(self._known - listed):  # deleted while no watch was open
            self._handler("DELETED", {"metadata": {"name": name, "namespace": namespace}}, now)
        self._known = listed
        for item in items:
            self._handler("ADDED", item, now)
        self._synced.set()
        return str(body.get("metadata", {}).get("resourceVersion", ""))

    def _run(self) -> None:
        version = ""
        while not self._stopped.is_set():
            try:
                if not version:
                    version = self._list()
                version = self._watch(version)
            except client.ApiException as error:
                if error.status == GONE:
                    version = ""
                    continue
                log.debug("%s: watch failed: %s", self.name, error)
                self._stopped.wait(RETRY_SECONDS)
            except Exception as error:  # the API server may be restarting; keep following
                # (an expired watch without deserialisation surfaces as a KeyError: relist)
                log.debug("%s: watch failed: %s", self.name, error)
                version = ""
                self._stopped.wait(RETRY_SECONDS)

    def _watch(self, version: str) -> str:
        stream = watch.Watch().stream(  # type: ignore[no-untyped-call]
            self._lister,
            **self._kwargs,
            resource_version=version,
            timeout_seconds=WATCH_TIMEOUT_SECONDS,
            allow_watch_bookmarks=True,
            deserialize=False,
        )
        for event in stream:
            kind, obj = event.get("type"), event.get("object") or {}
            version = str(obj.get("metadata", {}).get("resourceVersion", version))
            if kind in ("ADDED", "MODIFIED"):
                self._known.add(_key(obj))
            elif kind == "DELETED":
                self._known.discard(_key(obj))
            if kind in ("ADDED", "MODIFIED", "DELETED"):
                self._handler(str(kind), obj, time.time())
            if self._stopped.is_set():
                break
        return version


def _key(obj: dict[str, Any]) -> tuple[str, str]:
    metadata = obj.get("metadata") or {}
    return str(metadata.get("namespace") or ""), str(metadata.get("name") or "")


def _json(response: Any) -> dict[str, Any]:
    data = json.loads(response.data)
    return data if isinstance(data, dict) else {}
