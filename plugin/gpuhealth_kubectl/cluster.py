"""The plugin's only I/O: read and patch gpu-health's objects through the Kubernetes client.

Bodies are read raw (`_preload_content=False`) and returned as plain dicts: the
rendering in `views` is pure and sees exactly what `kubectl get -o json` shows.
A kubeconfig that cannot be loaded and an API server that cannot be reached
raise `Unreachable`, which the CLI turns into one line and exit code 3.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from typing import Any, Final

import urllib3.exceptions
import yaml
from kubernetes import client, config

from gpuhealth_api import resources

TIMEOUT: Final = (5.0, 30.0)
"""Connect and read timeouts of every request: an unreachable cluster is said in seconds, not minutes."""

RETRIES_429: Final = 5
MAX_RETRY_AFTER: Final = 2.0
"""Seconds to wait at most before trying a 429 again, whatever Retry-After says: a CLI, not a controller."""

Body = dict[str, Any]


class Unreachable(Exception):
    """No usable kubeconfig, or the API server does not answer (or refuses our credentials)."""


class NotFound(Exception):
    """The named object does not exist."""


class ApiError(Exception):
    """The API server answered with an error other than 404 (RBAC, validation, conflict)."""

    def __init__(self, message: str, status: int = 0, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.retry_after = retry_after


class Cluster:
    """One API server, as the kubeconfig's (or `--context`'s) context names it."""

    def __init__(
        self,
        kubeconfig: str | None = None,
        context: str | None = None,
        *,
        as_user: str | None = None,
        as_group: str | None = None,
    ) -> None:
        configuration = client.Configuration()
        try:
            # None: $KUBECONFIG (every listed file, merged as kubectl does), else ~/.kube/config.
            config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=kubeconfig, context=context, client_configuration=configuration
            )
        except (config.ConfigException, yaml.YAMLError, OSError, ValueError, TypeError, KeyError) as error:
            where = kubeconfig or "$KUBECONFIG or ~/.kube/config"
            raise Unreachable(f"cannot load kubeconfig ({where}): {_one_line(error)}") from error
        configuration.retries = 0
        self.server: str = configuration.host
        self.sleep: Callable[[float], None] = time.sleep
        self._api = client.ApiClient(configuration)
        # Impersonation as kubectl's --as/--as-group send it: the API server checks that the kubeconfig's
        # user may `impersonate`, then authorizes every request as the named user.
        if as_user:
            self._api.set_default_header("Impersonate-User", as_user)  # type: ignore[no-untyped-call]
        if as_group:
            self._api.set_default_header("Impersonate-Group", as_group)  # type: ignore[no-untyped-call]
        self._core = client.CoreV1Api(self._api)
        self._custom = client.CustomObjectsApi(self._api)

    def close(self) -> None:
        self._api.close()  # type: ignore[no-untyped-call]

    # Reads.

    def policies(self) -> list[Body]:
        return self._items(self._custom.list_cluster_custom_object, *_crd(resources.POLICY_PLURAL))

    def policy(self, name: str) -> Body:
        return self._call(self._custom.get_cluster_custom_object, *_crd(resources.POLICY_PLURAL), name)

    def gpunodes(self) -> list[Body]:
        return self._items(self._custom.list_cluster_custom_object, *_crd(resources.GPUNODE_PLURAL))

    def gpunode(self, name: str) -> Body | None:
        try:
            return self._call(self._custom.get_cluster_custom_object, *_crd(resources.GPUNODE_PLURAL), name)
        except NotFound:
            return None

    def nodes(self) -> list[Body]:
        return self._items(self._core.list_node)

    def node(self, name: str) -> Body | None:
        try:
            return self._call(self._core.read_node, name)
        except NotFound:
            return None

    def events(self, name: str) -> list[Body]:
        """Events about the Node or the GPUNode `name`, in every namespace (the operator posts in default)."""
        return self._items(
            self._core.list_event_for_all_namespaces, field_selector=f"involvedObject.name={name}"
        )

    # Writes: merge patches of exactly the fields the docs tell a human to change.

    def patch_policy(self, name: str, patch: Mapping[str, Any]) -> Body:
        return self._call(
            self._custom.patch_cluster_custom_object,
            *_crd(resources.POLICY_PLURAL),
            name,
            dict(patch),
            _content_type="application/merge-patch+json",
        )

    def annotate_gpunode(
        self, name: str, annotations: Mapping[str, str | None], *, resource_version: str | None = None
    ) -> Body:
        """`resource_version`: only if the GPUNode is still at it (else ApiError 409), for taking back a
        request that someone may be taking up at the same moment."""
        metadata: dict[str, Any] = {"annotations": dict(annotations)}
        if resource_version is not None:
            metadata["resourceVersion"] = resource_version
        return self._call(
            self._custom.patch_cluster_custom_object,
            *_crd(resources.GPUNODE_PLURAL),
            name,
            {"metadata": metadata},
            _content_type="application/merge-patch+json",
        )

    def _items(self, method: Any, *args: Any, **kwargs: Any) -> list[Body]:
        items: list[Body] = self._call(method, *args, **kwargs).get("items") or []
        return items

    def _call(self, method: Any, *args: Any, **kwargs: Any) -> Body:
        # 429 (a busy server, or a new CRD's storage still initializing): wait as told and try again,
        # as kubectl does; the last answer is the error.
        for attempt in range(RETRIES_429 + 1):
            try:
                return self._once(method, *args, **kwargs)
            except ApiError as error:
                if error.status != 429 or attempt == RETRIES_429:
                    raise
                self.sleep(min(MAX_RETRY_AFTER, max(0.1, error.retry_after or 1.0)))
        raise AssertionError("unreachable")  # pragma: no cover

    def _once(self, method: Any, *args: Any, **kwargs: Any) -> Body:
        try:
            response = method(*args, _preload_content=False, _request_timeout=TIMEOUT, **kwargs)
        except client.ApiException as error:
            if error.status == 404:
                raise NotFound(_message(error)) from error
            if error.status == 401:
                raise Unreachable(f"the API server at {self.server} refused our credentials (401)") from error
            raise ApiError(
                f"the API server said {error.status}: {_message(error)}", error.status, _retry_after(error)
            ) from error
        except (urllib3.exceptions.HTTPError, OSError) as error:
            raise Unreachable(f"cannot reach the API server at {self.server}: {_one_line(error)}") from error
        body: Body = json.loads(response.data)
        return body


def _crd(plural: str) -> tuple[str, str, str]:
    return resources.GROUP, resources.VERSION, plural


def _message(error: Any) -> str:
    """The Status message of an API error, else its reason."""
    try:
        message = json.loads(error.body).get("message")
    except (TypeError, ValueError, AttributeError):
        message = None
    return str(message or error.reason)


def _retry_after(error: Any) -> float | None:
    try:
        return float(str((error.headers or {}).get("Retry-After")))
    except (TypeError, ValueError, AttributeError):
        return None


def _one_line(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return text[:300] if text else type(error).__name__
