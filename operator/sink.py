"""Where the operator publishes what the extender hot-reloads: one small interface, two writers.

A :class:`Bundle` is the extender's policy file (``policy.yaml``: mode, modelPath, fallback, …), an
optional model file published next to it, and a little metadata (``bundle.json``: which policy and
generation, the model digest). A sink keeps two *slots*: ``current`` — the files the extender reads —
and ``last-good`` — the last bundle the extender loaded successfully, the rollback target; both
survive an operator restart.

- :class:`ConfigMapSink` (in a cluster): slot ``current`` is the ConfigMap the scheduler pod mounts
  (model in ``binaryData``), ``last-good`` a second ConfigMap ``<name>-last-good``. A ConfigMap
  holds at most 1 MiB; a larger model is refused with :class:`ModelTooLarge` — serve it from
  ``spec.model.path`` (a volume in the scheduler pod) instead. The kubelet swaps all keys of a
  ConfigMap volume at once, so the policy file and its model always change together.
- :class:`DirectorySink` (local runs, tests): slot ``current`` is a folder the extender process reads
  directly, ``last-good`` its hidden sub-folder ``.last-good``. Files are written to a temporary
  name, fsync'd and renamed; the model before ``policy.yaml``, so the extender never reads a policy
  file whose model is missing. The previous model file is kept one generation longer, because the
  extender may still be reading it.

A slot is read back for rollbacks and drift checks, and may have been truncated or edited by hand:
:meth:`Bundle.from_files` checks what it parses (:class:`CorruptBundle`), and ``read`` reports such a
slot once (a warning per distinct problem) and answers "empty"; a failed API call or file read is a
:class:`SinkError`, like a failed write.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import yaml

log = logging.getLogger("rlsched.operator.sink")

CURRENT = "current"
LAST_GOOD = "last-good"
SLOTS = (CURRENT, LAST_GOOD)
POLICY_FILE = "policy.yaml"
META_FILE = "bundle.json"
CONFIGMAP_LIMIT = 1024 * 1024
"""The API server's limit on a ConfigMap's data (keys and values together)."""


class SinkError(Exception):
    """Publishing failed; the message says why."""


class ModelTooLarge(SinkError):
    """The model does not fit the sink (a ConfigMap holds at most 1 MiB)."""


class CorruptBundle(ValueError):
    """A slot's files are not a bundle the operator wrote (truncated, edited by hand); says why."""


def _is_str(value: Any) -> bool:
    return isinstance(value, str)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_file_name(value: Any) -> bool:
    """A file name inside the slot (not a path that leads out of it)."""
    return isinstance(value, str) and value not in ("", ".", "..") and os.path.basename(value) == value


_SETTINGS_TYPES = {"modelPath": _is_str, "deadlineMs": _is_number, "topK": _is_int}
"""The policy file's keys the rollout computes with, and their types (``PolicySpec.extender_settings``)."""
_META_TYPES = {"digest": _is_str, "modelName": _is_file_name}


def _check(settings: Any, meta: Any) -> None:
    """A parsed slot holds what the operator writes; raises :class:`CorruptBundle` naming what does not."""
    if not isinstance(settings, dict):
        raise CorruptBundle(f"{POLICY_FILE} holds a {type(settings).__name__}, not a mapping")
    if not isinstance(meta, dict):
        raise CorruptBundle(f"{META_FILE} holds a {type(meta).__name__}, not an object")
    problems = [
        f"{file}: {key} is {values[key]!r:.60}"
        for file, values, types in ((POLICY_FILE, settings, _SETTINGS_TYPES), (META_FILE, meta, _META_TYPES))
        for key, ok in types.items()
        if values.get(key) is not None and not ok(values[key])
    ]
    if problems:
        raise CorruptBundle("; ".join(problems))


@dataclass(frozen=True)
class Bundle:
    """One published state: the extender's settings and, optionally, a model file."""

    settings: dict[str, Any]
    """The extender's policy file; an empty mapping means "the extender's own settings"."""
    model_name: str | None = None
    """File name of a model published with the bundle (content-addressed: ``model-<sha>.npz``)."""
    model: bytes | None = field(default=None, repr=False)
    """The model's bytes (None: no model published, or a ``spec.model.path`` model)."""
    meta: dict[str, Any] = field(default_factory=dict)
    """``policy`` (ns/name), ``generation``, ``digest``, ``source``, ``extenderWeight``, …"""

    @property
    def digest(self) -> str | None:
        return self.meta.get("digest")

    def same_content(self, other: Bundle | None) -> bool:
        """Same settings and model (metadata such as the generation may differ)."""
        return (
            other is not None
            and self.settings == other.settings
            and self.model_name == other.model_name
            and self.digest == other.digest
        )

    def files(self) -> dict[str, bytes]:
        out = {POLICY_FILE: policy_yaml(self.settings), META_FILE: json.dumps(self.meta, sort_keys=True).encode()}
        if self.model_name and self.model is not None:
            out[self.model_name] = self.model
        return out

    @classmethod
    def from_files(cls, files: dict[str, bytes]) -> Bundle:
        """The bundle a slot's files hold; raises :class:`CorruptBundle`."""
        try:
            settings = yaml.safe_load(files.get(POLICY_FILE, b"") or b"") or {}
            meta = json.loads(files[META_FILE]) if META_FILE in files else {}
        # JSONDecodeError and UnicodeDecodeError are ValueErrors; RecursionError: nested thousands deep
        except (yaml.YAMLError, ValueError, RecursionError) as exc:
            raise CorruptBundle(f"{type(exc).__name__}: {exc}") from None
        _check(settings, meta)
        models = [k for k in files if k not in (POLICY_FILE, META_FILE)]
        name = meta.get("modelName") or (models[0] if models else None)
        return cls(
            settings=settings,
            model_name=name if name in files else None,
            model=files.get(name) if name else None,
            meta=meta,
        )


def policy_yaml(settings: dict[str, Any]) -> bytes:
    """The policy file as the extender reads it (``off`` quoted: YAML 1.1 would read a boolean)."""
    header = "# Written by rlsched operator from a SchedulingPolicy; edits are overwritten.\n"
    body = yaml.safe_dump(settings, sort_keys=False) if settings else "{}\n"
    return (header + body).encode()


class PolicySink(Protocol):
    """Publishes bundles where the extender reads them."""

    def model_path(self, model_name: str) -> str:
        """Where the extender sees a model published under ``model_name``."""

    async def read(self, slot: str) -> Bundle | None:
        """The bundle in ``slot`` (None if empty)."""

    async def write(self, slot: str, bundle: Bundle) -> None:
        """Replace ``slot`` with ``bundle``; raises :class:`SinkError`."""

    async def clear(self, slot: str) -> None:
        """Empty ``slot``."""

    def describe(self) -> str:
        """For messages: ``configmap ns/name`` or ``directory /path``."""


class _CorruptSlots:
    """Reports a corrupt slot once per distinct problem: it is read again on every refresh tick."""

    def __init__(self) -> None:
        self._reported: dict[str, str] = {}

    def empty(self, where: str, slot: str, exc: CorruptBundle) -> None:
        """Report ``slot`` (at ``where``) as corrupt; a corrupt slot reads as empty."""
        problem = str(exc)
        if self._reported.get(slot) != problem:
            log.warning("%s (slot %s) is corrupt, read as empty: %s", where, slot, problem)
            self._reported[slot] = problem

    def fine(self, slot: str) -> None:
        self._reported.pop(slot, None)


# -- directory ------------------------------------------------------------------------------------


def fsync_dir(path: Path) -> None:
    """fsync a folder, so a rename or unlink in it is durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class DirectorySink:
    """Slots as folders: ``<dir>`` (current, read by the extender) and ``<dir>/.last-good``."""

    def __init__(self, directory: str | Path, mount_path: str | None = None):
        self.directory = Path(directory)
        self.mount_path = mount_path or str(self.directory.resolve())
        self._corrupt = _CorruptSlots()

    def describe(self) -> str:
        return f"directory {self.directory}"

    def _slot_dir(self, slot: str) -> Path:
        if slot not in SLOTS:
            raise ValueError(f"unknown slot {slot!r}")
        return self.directory if slot == CURRENT else self.directory / ".last-good"

    def model_path(self, model_name: str) -> str:
        return str(Path(self.mount_path) / model_name)

    async def read(self, slot: str) -> Bundle | None:
        """The bundle in ``slot``: None if empty or corrupt; raises :class:`SinkError` if unreadable."""
        try:
            bundle = await asyncio.to_thread(self._read, slot)
        except CorruptBundle as exc:
            self._corrupt.empty(str(self._slot_dir(slot)), slot, exc)
            return None
        except OSError as exc:
            raise SinkError(f"cannot read {self._slot_dir(slot)}: {exc.strerror or exc}") from None
        self._corrupt.fine(slot)
        return bundle

    def _read(self, slot: str) -> Bundle | None:
        d = self._slot_dir(slot)
        if not (d / POLICY_FILE).is_file():
            return None
        files = {POLICY_FILE: (d / POLICY_FILE).read_bytes()}
        if (d / META_FILE).is_file():
            files[META_FILE] = (d / META_FILE).read_bytes()
            name = Bundle.from_files(files).meta.get("modelName")  # checked: a file name in the slot
            if name and (d / name).is_file():
                files[name] = (d / name).read_bytes()
        return Bundle.from_files(files)

    async def write(self, slot: str, bundle: Bundle) -> None:
        try:
            await asyncio.to_thread(self._write, slot, bundle)
        except OSError as exc:
            raise SinkError(f"cannot write {self._slot_dir(slot)}: {exc.strerror or exc}") from None

    def _write(self, slot: str, bundle: Bundle) -> None:
        d = self._slot_dir(slot)
        d.mkdir(parents=True, exist_ok=True)
        previous = None
        if (d / META_FILE).is_file():
            try:
                previous = Bundle.from_files({META_FILE: (d / META_FILE).read_bytes()}).meta.get("modelName")
            except CorruptBundle:
                previous = None
        meta = dict(bundle.meta, modelName=bundle.model_name if bundle.model is not None else None)
        files = Bundle(bundle.settings, bundle.model_name, bundle.model, meta).files()
        # The model first, then the policy file (what the extender watches), the metadata last: it is
        # what the operator trusts (the generation published, a rollback's mark), so a write stopped
        # half-way (killed, disk full) leaves the old metadata and the next run publishes again. With
        # the metadata before the policy file, a rollback's mark could stand beside the failed
        # bundle's policy file, and every later run believed the rollback done.
        for name in sorted(files, key=lambda n: (n == META_FILE, n == POLICY_FILE)):
            _atomic_write(d / name, files[name])
        keep = {POLICY_FILE, META_FILE, previous, meta["modelName"]}
        for f in d.glob("model-*.npz"):
            if f.name not in keep:
                f.unlink(missing_ok=True)
        fsync_dir(d)

    async def clear(self, slot: str) -> None:
        await asyncio.to_thread(self._clear, slot)

    def _clear(self, slot: str) -> None:
        d = self._slot_dir(slot)
        if not d.is_dir():
            return
        for f in [*d.glob("model-*.npz"), d / META_FILE, d / POLICY_FILE]:
            f.unlink(missing_ok=True)


# -- ConfigMap ------------------------------------------------------------------------------------


class ConfigMapSink:
    """Slots as ConfigMaps: ``<name>`` (mounted by the scheduler pod) and ``<name>-last-good``."""

    def __init__(
        self,
        kube: Any,
        namespace: str,
        name: str,
        mount_path: str = "/etc/rlsched/policy",
        max_model_bytes: int = 900 * 1024,
    ):
        self.kube, self.namespace, self.name = kube, namespace, name
        self.mount_path = mount_path
        self.max_model_bytes = min(max_model_bytes, CONFIGMAP_LIMIT)
        self._corrupt = _CorruptSlots()

    def describe(self) -> str:
        return f"configmap {self.namespace}/{self.name}"

    def _name(self, slot: str) -> str:
        if slot not in SLOTS:
            raise ValueError(f"unknown slot {slot!r}")
        return self.name if slot == CURRENT else f"{self.name}-last-good"

    def model_path(self, model_name: str) -> str:
        return f"{self.mount_path.rstrip('/')}/{model_name}"

    async def read(self, slot: str) -> Bundle | None:
        """The bundle in ``slot``: None if empty or corrupt; raises :class:`SinkError` if the API fails."""
        try:
            cm = await self.kube.get_configmap(self.namespace, self._name(slot))
        except Exception as exc:  # KubeError and transport errors alike: the caller retries
            raise SinkError(f"cannot read ConfigMap {self.namespace}/{self._name(slot)}: {exc}") from None
        try:
            bundle = _configmap_bundle(cm)
        except CorruptBundle as exc:
            self._corrupt.empty(f"ConfigMap {self.namespace}/{self._name(slot)}", slot, exc)
            return None
        self._corrupt.fine(slot)
        return bundle

    async def write(self, slot: str, bundle: Bundle) -> None:
        meta = dict(bundle.meta, modelName=bundle.model_name if bundle.model is not None else None)
        files = Bundle(bundle.settings, bundle.model_name, bundle.model, meta).files()
        size = sum(len(k) + len(v) for k, v in files.items())
        model_size = len(bundle.model or b"")
        if model_size > self.max_model_bytes or size > CONFIGMAP_LIMIT:
            raise ModelTooLarge(
                f"the model is {model_size:,} bytes; the ConfigMap sink takes at most {self.max_model_bytes:,} "
                f"(a ConfigMap holds 1 MiB in all): put the model on a volume the scheduler pod mounts and set "
                f"spec.model.path, or raise sink.maxModelBytes if there is room"
            )
        data = {k: v.decode() for k, v in files.items() if k in (POLICY_FILE, META_FILE)}
        binary = {k: base64.b64encode(v).decode() for k, v in files.items() if k not in (POLICY_FILE, META_FILE)}
        try:
            await self.kube.put_configmap(
                self.namespace,
                self._name(slot),
                data,
                binary,
                labels={"app.kubernetes.io/managed-by": "rlsched-operator", "rlsched.io/slot": slot},
            )
        except Exception as exc:  # KubeError and transport errors alike: the caller retries
            raise SinkError(f"cannot write ConfigMap {self.namespace}/{self._name(slot)}: {exc}") from None

    async def clear(self, slot: str) -> None:
        await self.kube.delete_configmap(self.namespace, self._name(slot))


def _configmap_bundle(cm: Any) -> Bundle | None:
    """The bundle a slot's ConfigMap holds (None: no ConfigMap, or no policy file in it)."""
    if cm is None:
        return None
    if not isinstance(cm, dict):
        raise CorruptBundle(f"the ConfigMap is a {type(cm).__name__}")
    data, binary = cm.get("data") or {}, cm.get("binaryData") or {}
    if not (isinstance(data, dict) and isinstance(binary, dict)):
        raise CorruptBundle("data or binaryData is not a map")
    if not all(isinstance(v, str) for v in (*data.values(), *binary.values())):
        raise CorruptBundle("a data or binaryData value is not a string")
    try:
        files = {k: v.encode() for k, v in data.items()}
        files.update({k: base64.b64decode(v, validate=True) for k, v in binary.items()})
    except (binascii.Error, UnicodeEncodeError) as exc:  # both ValueErrors
        raise CorruptBundle(f"{type(exc).__name__}: {exc}") from None
    if POLICY_FILE not in files:
        return None
    return Bundle.from_files(files)
