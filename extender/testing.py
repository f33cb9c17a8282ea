"""Test helpers shipped with the package: v1.Node / v1.Pod JSON shaped like kube-scheduler sends it,
and an in-memory fake of the API calls the extender makes.

The objects carry what real ones carry — managedFields, conditions, images, env, volumes,
tolerations — so that parsing costs in tests and benchmarks are realistic (node ≈ 5 KB, pod ≈ 4 KB).
"""

from __future__ import annotations

import asyncio
import copy
import uuid
import zlib
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any

from .kubeapi import ApiError
from .settings import GpuConventions

if TYPE_CHECKING:
    from aiohttp import web

    from .server import Service

_GPU = GpuConventions()


def make_node(
    name: str,
    cpu: str = "96",
    memory: str = "384Gi",
    gpus: int = 0,
    model: str = "V100M16",
    labels: Mapping[str, str] | None = None,
    address: str | None = None,
    rv: str = "1000",
) -> dict[str, Any]:
    """A v1.Node as the API server returns it."""
    h = zlib.crc32(name.encode())
    address = address or f"10.{h % 250}.{(h >> 8) % 250}.{(h >> 16) % 250 + 1}"
    allocatable = {
        "cpu": cpu,
        "memory": memory,
        "ephemeral-storage": "1800Gi",
        "hugepages-1Gi": "0",
        "hugepages-2Mi": "0",
        "pods": "110",
    }
    node_labels = {
        "beta.kubernetes.io/arch": "amd64",
        "beta.kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "node.kubernetes.io/instance-type": "ecs.gn6v-c8g1.16xlarge",
        "topology.kubernetes.io/region": "cn-hangzhou",
        "topology.kubernetes.io/zone": "cn-hangzhou-b",
    }
    if gpus:
        allocatable[_GPU.gpu_resource] = str(gpus)
        node_labels[_GPU.node_model_labels[0]] = model
        node_labels["nvidia.com/gpu.count"] = str(gpus)
        node_labels["nvidia.com/gpu.product"] = f"Tesla-{model}"
    node_labels.update(labels or {})
    images = [
        {
            "names": [
                f"registry.example.com/team-{i}/training-image@sha256:{uuid.UUID(int=i + 7).hex * 2}",
                f"registry.example.com/team-{i}/training-image:v{i}.3.1",
            ],
            "sizeBytes": 1_000_000_000 + i,
        }
        for i in range(10)
    ]
    conditions = [
        {
            "type": t,
            "status": s,
            "lastHeartbeatTime": "2025-11-20T10:00:00Z",
            "lastTransitionTime": "2025-11-01T08:00:00Z",
            "reason": r,
            "message": m,
        }
        for t, s, r, m in (
            ("MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
            ("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
            ("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
            ("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
        )
    ]
    return {
        "kind": "Node",
        "apiVersion": "v1",
        "metadata": {
            "name": name,
            "uid": str(uuid.uuid5(uuid.NAMESPACE_DNS, name)),
            "resourceVersion": rv,
            "creationTimestamp": "2025-11-01T08:00:00Z",
            "labels": node_labels,
            "annotations": {
                "node.alpha.kubernetes.io/ttl": "0",
                "volumes.kubernetes.io/controller-managed-attach-detach": "true",
                "kubeadm.alpha.kubernetes.io/cri-socket": "unix:///run/containerd/containerd.sock",
            },
            "managedFields": [
                {
                    "manager": "kubelet",
                    "operation": "Update",
                    "apiVersion": "v1",
                    "time": "2025-11-20T10:00:00Z",
                    "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:status": {"f:conditions": {}, "f:images": {}, "f:nodeInfo": {}}},
                }
            ],
        },
        "spec": {
            "podCIDR": "10.244.1.0/24",
            "podCIDRs": ["10.244.1.0/24"],
            "providerID": f"alicloud://cn-hangzhou.{name}",
        },
        "status": {
            "capacity": dict(allocatable),
            "allocatable": allocatable,
            "conditions": conditions,
            "addresses": [{"type": "InternalIP", "address": address}, {"type": "Hostname", "address": name}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {
                "machineID": uuid.uuid5(uuid.NAMESPACE_URL, name).hex,
                "systemUUID": str(uuid.uuid5(uuid.NAMESPACE_OID, name)),
                "bootID": str(uuid.uuid5(uuid.NAMESPACE_X500, name)),
                "kernelVersion": "5.15.0-91-generic",
                "osImage": "Ubuntu 22.04.3 LTS",
                "containerRuntimeVersion": "containerd://1.7.2",
                "kubeletVersion": "v1.37.2",
                "kubeProxyVersion": "v1.37.2",
                "operatingSystem": "linux",
                "architecture": "amd64",
            },
            "images": images,
        },
    }


def make_pod(
    name: str,
    cpu: str = "4",
    memory: str = "16Gi",
    gpus: int = 0,
    gpu_milli: int = 0,
    gpu_models: str = "",
    namespace: str = "default",
    uid: str | None = None,
    node: str = "",
    annotations: Mapping[str, str] | None = None,
    scheduler: str = "rl-scheduler",
    rv: str = "2000",
    share_as_resource: bool = True,
) -> dict[str, Any]:
    """A v1.Pod as kube-scheduler sends it in ExtenderArgs (pending unless ``node``)."""
    uid = uid or str(uuid.uuid4())
    limits: dict[str, str] = {"cpu": cpu, "memory": memory}
    requests: dict[str, str] = {"cpu": cpu, "memory": memory}
    ann = {"kubectl.kubernetes.io/restartedAt": "2025-11-20T10:00:00Z", "prometheus.io/scrape": "true"}
    if gpus:
        limits[_GPU.gpu_resource] = requests[_GPU.gpu_resource] = str(gpus)
    if gpu_milli:
        if share_as_resource:
            limits[_GPU.gpu_milli_resource] = requests[_GPU.gpu_milli_resource] = str(gpu_milli)
        else:
            ann[_GPU.gpu_milli_annotation] = str(gpu_milli)
    if gpu_models:
        ann[_GPU.gpu_models_annotation] = gpu_models
    ann.update(annotations or {})
    env = [{"name": f"ENV_VAR_{i}", "value": f"value-{i}-" + "x" * 20} for i in range(18)]
    return {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": uid,
            "resourceVersion": rv,
            "generation": 1,
            "creationTimestamp": "2025-11-20T10:00:00Z",
            "generateName": name.rsplit("-", 1)[0] + "-",
            "labels": {"app": "trainer", "pod-template-hash": "5d8f7c9b4", "team": "vision"},
            "annotations": ann,
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": "trainer-5d8f7c9b4",
                    "uid": str(uuid.uuid5(uuid.NAMESPACE_DNS, "rs")),
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
            "managedFields": [
                {
                    "manager": "kube-controller-manager",
                    "operation": "Update",
                    "apiVersion": "v1",
                    "time": "2025-11-20T10:00:00Z",
                    "fieldsType": "FieldsV1",
                    "fieldsV1": {
                        "f:metadata": {"f:generateName": {}, "f:labels": {}, "f:ownerReferences": {}},
                        "f:spec": {"f:containers": {}, "f:schedulerName": {}},
                    },
                }
            ],
        },
        "spec": {
            "volumes": [
                {"name": "data", "persistentVolumeClaim": {"claimName": "dataset"}},
                {
                    "name": "kube-api-access-abcde",
                    "projected": {
                        "sources": [
                            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                            {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                            {
                                "downwardAPI": {
                                    "items": [
                                        {
                                            "path": "namespace",
                                            "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"},
                                        }
                                    ]
                                }
                            },
                        ],
                        "defaultMode": 420,
                    },
                },
            ],
            "containers": [
                {
                    "name": "trainer",
                    "image": "registry.example.com/vision/trainer:v2.7.1",
                    "command": ["python", "-m", "trainer"],
                    "args": ["--epochs", "90", "--batch-size", "256", "--data", "/data"],
                    "ports": [{"name": "metrics", "containerPort": 9090, "protocol": "TCP"}],
                    "env": env,
                    "resources": {"limits": limits, "requests": requests},
                    "volumeMounts": [
                        {"name": "data", "mountPath": "/data"},
                        {
                            "name": "kube-api-access-abcde",
                            "readOnly": True,
                            "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
                        },
                    ],
                    "livenessProbe": {
                        "httpGet": {"path": "/healthz", "port": 9090, "scheme": "HTTP"},
                        "timeoutSeconds": 1,
                        "periodSeconds": 10,
                        "successThreshold": 1,
                        "failureThreshold": 3,
                    },
                    "terminationMessagePath": "/dev/termination-log",
                    "terminationMessagePolicy": "File",
                    "imagePullPolicy": "IfNotPresent",
                }
            ],
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": 30,
            "dnsPolicy": "ClusterFirst",
            "serviceAccountName": "default",
            "serviceAccount": "default",
            "securityContext": {},
            "schedulerName": scheduler,
            **({"nodeName": node} if node else {}),
            "tolerations": [
                {
                    "key": "node.kubernetes.io/not-ready",
                    "operator": "Exists",
                    "effect": "NoExecute",
                    "tolerationSeconds": 300,
                },
                {
                    "key": "node.kubernetes.io/unreachable",
                    "operator": "Exists",
                    "effect": "NoExecute",
                    "tolerationSeconds": 300,
                },
                {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
            ],
            "priority": 0,
            "enableServiceLinks": True,
            "preemptionPolicy": "PreemptLowerPriority",
        },
        "status": {
            "phase": "Running" if node else "Pending",
            "qosClass": "Guaranteed",
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "True" if node else "False",
                    "lastProbeTime": None,
                    "lastTransitionTime": "2025-11-20T10:00:00Z",
                }
            ],
        },
    }


class FakeKubeApi:
    """The extender's API calls against an in-memory store of pods (and nodes for list/watch).

    ``fail`` maps a call name (``patch``, ``bind``, ``get``) to an ApiError to raise, or to a number
    of seconds to stall; ``delay_s`` makes every write await (so concurrent binds interleave).
    """

    def __init__(
        self, nodes: list[dict[str, Any]] | None = None, pods: list[dict[str, Any]] | None = None, delay_s: float = 0.0
    ):
        self.nodes = {n["metadata"]["name"]: copy.deepcopy(n) for n in nodes or []}
        self.pods = {(p["metadata"]["namespace"], p["metadata"]["name"]): copy.deepcopy(p) for p in pods or []}
        self.delay_s = delay_s
        self.fail: dict[str, Any] = {}
        self.calls: list[tuple[Any, ...]] = []
        self.rv = 5000
        self._watchers: list[tuple[bool, asyncio.Queue[dict[str, Any] | None]]] = []

    async def _maybe_fail(self, what: str) -> None:
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        f = self.fail.get(what)
        if isinstance(f, ApiError):
            raise f
        if isinstance(f, (int, float)) and f:
            await asyncio.sleep(f)
            raise ApiError(0, "Timeout", f"{what}: no answer within the timeout")

    async def get_pod(self, namespace: str, name: str, timeout: float) -> dict[str, Any]:
        self.calls.append(("get", namespace, name))
        await self._maybe_fail("get")
        pod = self.pods.get((namespace, name))
        if pod is None:
            raise ApiError(404, "NotFound", f'pods "{name}" not found')
        return copy.deepcopy(pod)

    async def create_binding(
        self,
        namespace: str,
        name: str,
        uid: str,
        node: str,
        timeout: float,
        annotations: Mapping[str, str] | None = None,
    ) -> None:
        """Like kube-apiserver's BindingREST: node and the Binding's annotations in one update."""
        self.calls.append(("bind", namespace, name, node, dict(annotations or {})))
        await self._maybe_fail("bind")
        pod = self.pods.get((namespace, name))
        if pod is None:
            raise ApiError(404, "NotFound", f'pods "{name}" not found')
        if pod["metadata"]["uid"] != uid:
            raise ApiError(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on pods/binding "{name}": '
                f"the UID in the precondition ({uid}) does not match",
            )
        if pod["spec"].get("nodeName"):
            raise ApiError(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on pods/binding "{name}": '
                f'pod {name} is already assigned to node "{pod["spec"]["nodeName"]}"',
            )
        pod["spec"]["nodeName"] = node
        if annotations:
            pod["metadata"].setdefault("annotations", {}).update(annotations)
        pod["status"]["phase"] = "Running"
        self._bump(pod)

    def _bump(self, obj: dict[str, Any]) -> None:
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        self.emit({"type": "MODIFIED", "object": obj})

    def emit(self, event: dict[str, Any] | None) -> None:
        """Send a watch event (a copy) to every open watch of its kind; None ends the watches."""
        for nodes, queue in self._watchers:
            if event is None or (event["object"].get("kind") == "Node") == nodes:
                queue.put_nowait(copy.deepcopy(event))

    async def list(self, path: str, timeout: float = 60.0, limit: int = 500) -> tuple[list[dict[str, Any]], str]:
        self.calls.append(("list", path))
        await self._maybe_fail("list")
        items = self.nodes.values() if "nodes" in path else self.pods.values()
        return [copy.deepcopy(i) for i in items], str(self.rv)

    async def watch(
        self, path: str, resource_version: str, timeout_s: int, on_open: Any = None
    ) -> AsyncIterator[dict[str, Any]]:
        self.calls.append(("watch", path, resource_version))
        await self._maybe_fail("watch")
        if on_open is not None:
            on_open()
        queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        watcher = ("nodes" in path, queue)
        self._watchers.append(watcher)
        try:
            while True:
                event = await queue.get()
                if event is None:
                    return
                yield event
        finally:
            self._watchers.remove(watcher)

    async def close(self) -> None:
        pass


class Harness:
    """An extender over an in-memory cache and a :class:`FakeKubeApi`, for tests and benchmarks."""

    def __init__(
        self,
        nodes: list[dict[str, Any]],
        pods: list[dict[str, Any]] | None = None,
        settings: Any = None,
        model_loader: Any = None,
        api: FakeKubeApi | None = None,
    ):
        from .binder import Binder
        from .cache import ClusterCache
        from .decision_ring import DecisionRing
        from .metrics import Metrics
        from .policy import PolicyEngine, load_model
        from .rejections import Rejections
        from .settings import ExtenderSettings
        from .verbs import Extender

        self.settings = settings or ExtenderSettings()
        self.metrics = Metrics()
        self.api = api or FakeKubeApi(nodes, pods)
        self.cache = ClusterCache(
            self.settings.gpu,
            self.settings.policy.seed,
            rejections=Rejections(lambda kind, reason: self.metrics.objects_rejected.labels(kind, reason).inc()),
            scheduler_name=self.settings.kubernetes.scheduler_name,
        )
        self.cache.replace_nodes(nodes)
        self.cache.replace_pods(pods or [])
        self.engine = PolicyEngine(
            self.settings.policy, self.settings.policy_file, model_loader or load_model, self.metrics
        )
        self.engine.start(strict_model=self.settings.strict_model)
        self.ring = DecisionRing(self.settings.decision_ring_size)
        self.binder = Binder(self.cache, self.engine, self.api, self.settings.gpu, self.settings.kubernetes)
        self.extender = Extender(self.cache, self.engine, self.binder, self.ring, self.settings, self.metrics)

    def app(self) -> web.Application:
        from .app import make_app

        return make_app(self.extender, self.metrics, self.settings)

    def status_app(self) -> web.Application:
        from .app import Health, make_status_app

        health = Health()
        health.started = True
        health.checks["cache"] = lambda: None if self.cache.ready else "not listed"
        return make_status_app(self.extender, self.metrics, health)

    def add_pod(self, pod: dict[str, Any]) -> dict[str, Any]:
        """Store a pending pod in the fake API (as kube-scheduler would find it)."""
        self.api.pods[(pod["metadata"]["namespace"], pod["metadata"]["name"])] = copy.deepcopy(pod)
        return pod


class ScriptedWatchApi:
    """``list``/``watch`` answers from a script, for the informer's rules: ``("list", items, rv)`` or
    ``("list", exception)``, ``("watch", events)`` (an exception among the events is raised where it
    stands), ``("stop",)`` (the default once the script is used up) cancels the informer."""

    def __init__(self, script: list[tuple[Any, ...]]):
        self.script = list(script)
        self.calls: list[tuple[Any, ...]] = []

    async def list(self, path: str, timeout: float = 60.0, limit: int = 500) -> tuple[list[Any], str]:
        self.calls.append(("list",))
        step = self.script.pop(0)
        assert step[0] == "list", step
        if isinstance(step[1], BaseException):
            raise step[1]
        return step[1], step[2]

    async def watch(self, path: str, rv: str, timeout_s: float, on_open: Any = None) -> AsyncIterator[Any]:
        self.calls.append(("watch", rv))
        step = self.script.pop(0) if self.script else ("stop",)
        if step[0] == "stop":
            raise asyncio.CancelledError
        assert step[0] == "watch", step
        if on_open is not None:
            on_open()
        for event in step[1]:
            if isinstance(event, BaseException):
                raise event
            yield event


async def start_service(api: Any, settings: Any) -> tuple[Service, asyncio.Event, asyncio.Task[int]]:
    """Run :func:`rlsched.extender.server.serve` with a fake API until it is ready; returns the
    service, the event that stops it and its task (start-up errors are raised here)."""
    from .server import serve

    box: dict[str, Service] = {}
    stop = asyncio.Event()
    ready = asyncio.Event()

    def on_ready(service: Service) -> None:
        box["service"] = service
        ready.set()

    task = asyncio.create_task(serve(settings, api=api, stop=stop, ready=on_ready))
    waiter = asyncio.create_task(ready.wait())
    await asyncio.wait([task, waiter], return_when=asyncio.FIRST_COMPLETED)
    if task.done():
        waiter.cancel()
        task.result()
    return box["service"], stop, task
