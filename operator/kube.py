"""The operator's own API calls (besides kopf's watches): ConfigMaps, pod patches, CRDs.

The official client is synchronous; every call runs in a worker thread with a timeout and returns
plain dicts (``_preload_content=False``: no model classes). Errors become :class:`KubeError` with the
HTTP status, so callers can tell "not found" (404), "changed meanwhile" (409) and "try later"
(0 = no answer, 429, 5xx) apart. :meth:`Kube.connection_info` hands the same credentials to kopf.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import kopf

log = logging.getLogger("rlsched.operator.kube")


class KubeError(Exception):
    """An API call that failed: ``status`` 0 when there was no HTTP answer."""

    def __init__(self, status: int, reason: str, message: str):
        self.status, self.reason = status, reason
        super().__init__(f"{status} {reason}: {message}" if status else f"{reason}: {message}")

    @property
    def transient(self) -> bool:
        return self.status in (0, 409, 429) or self.status >= 500


def load_configuration(kubeconfig: str | None, context: str | None) -> Any:
    """A ``kubernetes.client.Configuration``: the kubeconfig if given, else in-cluster, else the
    default kubeconfig ($KUBECONFIG, ~/.kube/config). Never touches the client's global default."""
    import kubernetes

    cfg = kubernetes.client.Configuration()
    if kubeconfig:
        kubernetes.config.load_kube_config(
            config_file=kubeconfig, context=context, client_configuration=cfg, persist_config=False
        )
        return cfg
    try:
        kubernetes.config.load_incluster_config(client_configuration=cfg)
    except kubernetes.config.ConfigException:
        try:
            kubernetes.config.load_kube_config(context=context, client_configuration=cfg, persist_config=False)
        except (kubernetes.config.ConfigException, OSError, TypeError) as exc:
            raise ValueError(
                "no Kubernetes credentials: not in a cluster, and no kubeconfig "
                f"(--kubeconfig, $KUBECONFIG or ~/.kube/config): {exc}"
            ) from None
    return cfg


class Kube:
    """Async wrappers over the client for what the operator writes."""

    def __init__(self, configuration: Any, timeout_s: float = 10.0):
        import kubernetes

        self.configuration = configuration
        self.timeout_s = timeout_s
        self.api_client = kubernetes.client.ApiClient(configuration)
        self.core = kubernetes.client.CoreV1Api(self.api_client)
        self.ext = kubernetes.client.ApiextensionsV1Api(self.api_client)
        self._exc = kubernetes.client.ApiException

    def connection_info(self) -> kopf.ConnectionInfo:
        """The same credentials as kopf's :class:`kopf.ConnectionInfo` (for ``@kopf.on.login``)."""
        import kopf

        cfg = self.configuration
        header = cfg.get_api_key_with_prefix("BearerToken") or cfg.get_api_key_with_prefix("authorization")
        parts = header.split(" ", 1) if header else []
        scheme, token = (None, None) if not parts else (None, parts[0]) if len(parts) == 1 else (parts[0], parts[1])
        return kopf.ConnectionInfo(
            server=cfg.host,
            ca_path=cfg.ssl_ca_cert,
            insecure=not cfg.verify_ssl,
            username=cfg.username or None,
            password=cfg.password or None,
            scheme=scheme,
            token=token,
            certificate_path=cfg.cert_file,
            private_key_path=cfg.key_file,
        )

    async def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """``fn`` in a worker thread, its answer read and decoded there too: with
        ``_preload_content=False`` the client returns after the headers, and reading the body (a
        slow or large answer) on kopf's event loop held every handler. Whatever fails — the call,
        the read, the decoding — is a :class:`KubeError`."""
        kwargs.setdefault("_request_timeout", self.timeout_s)
        kwargs.setdefault("_preload_content", False)

        def call() -> Any:
            resp = fn(*args, **kwargs)
            data = resp.data if hasattr(resp, "data") else resp
            return json.loads(data) if data else None

        try:
            return await asyncio.to_thread(call)
        except self._exc as exc:
            message = exc.body or exc.reason or ""
            if exc.body:
                try:
                    message = json.loads(exc.body).get("message", message)
                except (TypeError, ValueError, AttributeError):
                    pass
            raise KubeError(exc.status or 0, exc.reason or "Error", str(message)) from None
        except Exception as exc:  # noqa: BLE001 - urllib3 timeouts, refused connections, cut or garbled answers
            raise KubeError(0, type(exc).__name__, str(exc)[:500]) from None

    # -- ConfigMaps ---------------------------------------------------------------------------------
    async def get_configmap(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            cm: dict[str, Any] = await self._call(self.core.read_namespaced_config_map, name, namespace)
            return cm
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise

    async def put_configmap(
        self,
        namespace: str,
        name: str,
        data: Mapping[str, str],
        binary_data: Mapping[str, str],
        labels: Mapping[str, str] | None = None,
    ) -> None:
        """Create or replace (optimistic concurrency: a concurrent change makes it retry once)."""
        for attempt in range(3):
            current = await self.get_configmap(namespace, name)
            meta: dict[str, Any] = {"name": name, "namespace": namespace, "labels": dict(labels or {})}
            body = {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": meta,
                "data": dict(data),
                "binaryData": dict(binary_data),
            }
            try:
                if current is None:
                    await self._call(self.core.create_namespaced_config_map, namespace, body)
                else:
                    meta["resourceVersion"] = current["metadata"]["resourceVersion"]
                    meta["labels"] = {**(current["metadata"].get("labels") or {}), **meta["labels"]}
                    meta["annotations"] = current["metadata"].get("annotations") or {}
                    await self._call(self.core.replace_namespaced_config_map, name, namespace, body)
                return
            except KubeError as exc:
                if exc.status != 409 or attempt == 2:
                    raise

    async def delete_configmap(self, namespace: str, name: str) -> None:
        try:
            await self._call(self.core.delete_namespaced_config_map, name, namespace)
        except KubeError as exc:
            if exc.status != 404:
                raise

    # -- pods ---------------------------------------------------------------------------------------
    async def patch_pod_annotations(
        self, namespace: str, name: str, uid: str, annotations: Mapping[str, str]
    ) -> dict[str, Any]:
        """Merge-patch annotations; ``metadata.uid`` in the patch is a precondition (409 if recreated).
        The operator's only write to pods: RBAC grants pod patch and nothing on pods/status, and the
        chart's admission policy lets this identity change nothing but ``rlsched.io/`` annotations."""
        body = {"metadata": {"uid": uid, "annotations": dict(annotations)}}
        pod: dict[str, Any] = await self._call(
            self.core.patch_namespaced_pod, name, namespace, body, _content_type="application/merge-patch+json"
        )
        return pod

    async def post_event(
        self, ref: Mapping[str, Any], type_: str, reason: str, message: str, component: str = "rlsched-operator"
    ) -> None:
        """A core/v1 Event about ``ref`` (apiVersion, kind, namespace, name, uid). Best effort:
        failures are logged, never raised (an event must not break the work it reports)."""
        import datetime as dt

        now = dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")
        namespace = ref.get("namespace") or "default"
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{ref.get('name', 'object')}.", "namespace": namespace},
            "involvedObject": {k: ref[k] for k in ("apiVersion", "kind", "namespace", "name", "uid") if ref.get(k)},
            "reason": reason,
            "message": message[:1024],
            "type": type_,
            "source": {"component": component},
            "reportingComponent": component,
            "reportingInstance": component,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            await self._call(self.core.create_namespaced_event, namespace, body)
        except KubeError as exc:
            log.warning("could not post event %s on %s/%s: %s", reason, namespace, ref.get("name"), exc)

    # -- the rebalancer's reads and evictions -------------------------------------------------------
    async def list_all(self, kind: str, limit: int = 2000, max_items: int = 200_000, **params: Any) -> list[Any]:
        """Every node, namespace or pod (``kind``), in pages of ``limit``; more than ``max_items`` is
        refused with a KubeError (413) instead of growing without bound."""
        fn = {
            "nodes": self.core.list_node,
            "namespaces": self.core.list_namespace,
            "pods": self.core.list_pod_for_all_namespaces,
        }[kind]
        items: list[Any] = []
        token: str | None = None
        while True:
            page = await self._call(fn, limit=limit, _continue=token, **params)
            if not isinstance(page, dict):
                raise KubeError(0, "BadList", f"list {kind}: not a list object")
            batch = page.get("items")
            items.extend(batch if isinstance(batch, list) else [])
            if len(items) > max_items:
                raise KubeError(413, "TooMany", f"more than {max_items} {kind}")
            token = (page.get("metadata") or {}).get("continue") or None
            if not token:
                return items

    async def evict_pod(self, namespace: str, name: str, uid: str, dry_run: bool = False) -> None:
        """POST the policy/v1 Eviction subresource (the API server checks PodDisruptionBudgets: 429
        when one forbids it). ``uid`` is a precondition (a recreated pod of the same name is not
        touched); ``dry_run`` asks with ``dryRun: [All]``: every check runs, nothing changes."""
        body: dict[str, Any] = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": namespace},
            "deleteOptions": {"preconditions": {"uid": uid}, **({"dryRun": ["All"]} if dry_run else {})},
        }
        await self._call(self.core.create_namespaced_pod_eviction, name, namespace, body)

    # -- the served SchedulingPolicy ------------------------------------------------------------------
    async def patch_policy_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> None:
        """Merge-patch a SchedulingPolicy's ``status`` (kopf patches it after each handler; the
        rebalancer writes each eviction there before making it, :mod:`.rebalance_budget`)."""
        import kubernetes

        from .spec import GROUP, PLURAL, VERSION

        api = kubernetes.client.CustomObjectsApi(self.api_client)
        await self._call(
            api.patch_namespaced_custom_object_status,
            GROUP,
            VERSION,
            namespace,
            PLURAL,
            name,
            {"status": dict(status)},
            _content_type="application/merge-patch+json",
        )

    # -- CRDs ---------------------------------------------------------------------------------------
    async def apply_crd(self, manifest: Mapping[str, Any]) -> None:
        """Create the CRD, or replace it when it exists (keeping its resourceVersion)."""
        name = manifest["metadata"]["name"]
        try:
            current = await self._call(self.ext.read_custom_resource_definition, name)
        except KubeError as exc:
            if exc.status != 404:
                raise
            current = None
        if current is None:
            await self._call(self.ext.create_custom_resource_definition, dict(manifest))
        else:
            body = json.loads(json.dumps(manifest))
            body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
            await self._call(self.ext.replace_custom_resource_definition, name, body)

    async def crd_established(self, name: str) -> bool:
        try:
            crd = await self._call(self.ext.read_custom_resource_definition, name)
        except KubeError:
            return False
        return any(
            c.get("type") == "Established" and c.get("status") == "True"
            for c in (crd.get("status") or {}).get("conditions") or []
        )

    def close(self) -> None:
        self.api_client.close()
