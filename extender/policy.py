"""The policy behind the verbs: the learned model when there is one, a heuristic whenever not.

:class:`PolicyEngine` owns the scorers and answers one question — "for this pod, over these candidate
nodes, which node and cards?" — through :func:`rlsched.policy.decide`:

- ``active``: the exported PPO policy (``make_scorer("ppo:PATH")``) scores under a per-request
  deadline (a SIGALRM timer on the loop's thread by default — :class:`DeadlineTimer` — or a worker
  thread); no model, a load error, an exception, a bad output or the deadline → the fallback
  heuristic's answer is served and the reason counted.
- ``shadow``: the heuristic serves; the policy's choice is computed after the answer and only
  recorded (agree/disagree counters, the decision ring).
- ``off``: the heuristic alone.

Models and the policy file are hot-reloaded (:meth:`PolicyEngine.poll`): a new file is loaded off the
event loop and swapped in atomically; if it fails the old one keeps serving and the error is shown
in /status and counted. With ``modelSha256`` in the settings, a file with other bytes fails the same
way before the loader reads it. A policy file that names another model takes effect together with
that model, never before it: the mode in effect and the model in effect always come from the same
policy file (:class:`PolicyEngine`).

The learned policy may also answer *delay* instead of a node (models trained with the delay action
in the living cluster do; *reject* no trainer produces): a scorer with a
``verdict(state, req, nodes, scores)`` method returning a :class:`Verdict` (or
``(action, reason, retry_after_s)``) makes filter hold the pod back.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import signal
import stat
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from rlsched.policy.cluster import ClusterState, PodRequest
from rlsched.policy.decision import Decision, decide
from rlsched.policy.delay_head import MAX_HOLD_S
from rlsched.policy.export import MAX_MODEL_BYTES, MAX_TYPICAL_PODS
from rlsched.policy.scorers import NodeScores, Scorer, TieBreak, canonical_name, make_scorer
from rlsched.policy.typical import TypicalPods

from .settings import ConfigError, PolicySettings, load_policy_file

log = logging.getLogger("rlsched.extender.policy")
_T = TypeVar("_T")

FALLBACK_REASONS = ("no-model", "error", "deadline", "bad-output", "busy", "mode-shadow", "mode-off")
"""Why the fallback heuristic served (the ``reason`` label of ``rlsched_fallbacks_total``)."""


MAX_RETRY_AFTER_S = MAX_HOLD_S
"""The longest hold a delay verdict may ask; a model that asks more, less than nothing or not a number
gives bad output: the pod is placed by the fallback, and the failure is counted."""


@dataclass(frozen=True)
class Verdict:
    """A policy's answer other than a node."""

    action: str
    """``delay`` (try again later: every node FailedNodes) or ``reject`` (FailedAndUnresolvableNodes)."""
    reason: str
    retry_after_s: float = 30.0


@dataclass
class Outcome:
    """The answer for one pod."""

    decision: Decision | None
    """None when no candidate node fits (or a verdict holds the pod back)."""
    served_by: str
    """``policy`` or ``fallback``."""
    scorer: str
    """Name of the scorer whose answer is served."""
    fallback_reason: str | None = None
    verdict: Verdict | None = None
    policy_ms: float | None = None
    """Time the learned policy took (None when it did not run)."""
    error: str = ""
    """The policy's error message when it failed."""
    model_version: str | None = None
    shadow: dict[str, Any] | None = None
    """In shadow mode, what the policy would have done (filled in after the answer)."""


@dataclass
class ModelInfo:
    """What /status shows about the model."""

    path: str | None = None
    version: str | None = None
    digest: str | None = None
    loaded_at: float | None = None
    error: str | None = None
    """The last load error (the previous model, if any, keeps serving)."""
    error_at: float | None = None
    error_path: str | None = None
    """The file the last load error is about (may differ from ``path`` while an older model serves)."""
    error_kind: str | None = None
    """What the last load error was: ``digest`` (the file's sha256 is not the policy file's
    ``modelSha256``: it was not read) or ``load`` (anything else). The operator's rollout tells a
    digest refusal from a broken model by it, not by the words of ``error``."""
    file_digest: str | None = None
    """sha256 of the file as read (detects changes on disk)."""


@dataclass(frozen=True)
class _FailedFile:
    """A model file that failed to load: not tried again until it (or the expected digest) changes."""

    path: str
    key: tuple[Any, ...] | None
    """The file's stat key when it failed (:func:`_stat_key`)."""
    sha256: str | None
    """The ``modelSha256`` it was checked against."""
    error: str
    """Why it failed: shown again when the policy file names the same file again."""
    kind: str = "load"
    """``ModelInfo.error_kind`` of that failure."""


def default_typical() -> TypicalPods:
    """The built-in typical pods (openb default trace, 35 groups) shipped with the extender."""
    text = resources.files("rlsched.extender").joinpath("typical_default.json").read_text(encoding="utf-8")
    return TypicalPods.from_json(json.loads(text)["typicalPods"])


MAX_TYPICAL_BYTES = 1 << 20
"""Largest typical pods file read (the built-in one is 3 KiB for 35 groups): a larger one is refused
unread, as a model file over ``MAX_MODEL_BYTES`` is."""

MAX_TYPICAL_GROUPS = MAX_TYPICAL_PODS
"""Most typical pod groups a typical pods file may list: 1,024, as many as a model's manifest may
carry (the built-in file has 35); a file with more is refused like any other bad one. The FGD
fallback's fragmentation measure runs over every group for every candidate node, so its cost per
decision is linear in this: at 500 nodes 0.2–0.5 ms with 35 groups, 2–4 ms with 1,024, 25–45 ms with
the ~12,500 groups that fit in :data:`MAX_TYPICAL_BYTES`."""


def _nonblocking(path: str, flags: int) -> int:
    """``open``'s opener: a FIFO opens at once instead of waiting for a writer (then fails the
    regular-file check); a regular file reads as always."""
    return os.open(path, flags | getattr(os, "O_NONBLOCK", 0))


def read_regular_file(path: str, max_bytes: int, what: str) -> bytes:
    """The bytes of ``path``, refused (ConfigError) unless it is a regular file of at most ``max_bytes``.

    A FIFO would block the reader until a writer comes, and a device such as /dev/zero never ends:
    both are refused after ``fstat`` of the opened file, before anything is read."""
    try:
        with open(path, "rb", opener=_nonblocking) as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise ConfigError(f"{what} {path}: not a regular file; not read")
            if st.st_size > max_bytes:
                raise ConfigError(f"{what} {path}: larger than {max_bytes:,} bytes; not read")
            data = f.read(max_bytes + 1)
    except OSError as exc:
        raise ConfigError(f"{what} {path}: cannot read: {exc.strerror or exc}") from None
    if len(data) > max_bytes:  # it grew after the fstat
        raise ConfigError(f"{what} {path}: larger than {max_bytes:,} bytes; not read")
    return data


def load_typical(path: str) -> TypicalPods:
    """Typical pods from a JSON file (a list, or an object with ``typicalPods``): a regular file of at
    most :data:`MAX_TYPICAL_BYTES` (:func:`read_regular_file`), of at most :data:`MAX_TYPICAL_GROUPS`
    groups. Whatever is wrong with the file raises ConfigError."""
    raw = read_regular_file(path, MAX_TYPICAL_BYTES, "typical pods file")
    try:
        data = json.loads(raw.decode("utf-8"))
    except ValueError as exc:  # UnicodeDecodeError is one
        raise ConfigError(f"typical pods file {path}: {exc}") from None
    except RecursionError:  # [[[…]]] a thousand deep, well under the size cap
        raise ConfigError(f"typical pods file {path}: JSON nested too deeply to parse") from None
    except MemoryError:
        raise ConfigError(f"typical pods file {path}: JSON too large to parse") from None
    if isinstance(data, dict):
        data = data.get("typicalPods")
    if not isinstance(data, list):
        raise ConfigError(f"typical pods file {path}: expected a list of typical pods or an object with 'typicalPods'")
    if len(data) > MAX_TYPICAL_GROUPS:
        raise ConfigError(
            f"typical pods file {path}: {len(data):,} typical pods; at most {MAX_TYPICAL_GROUPS:,} "
            "(the FGD fallback's cost per decision grows with each)"
        )
    try:
        return TypicalPods.from_json(data)
    except ValueError as exc:
        raise ConfigError(f"typical pods file {path}: {exc}") from None


def typical_digest(typical: TypicalPods) -> str:
    """sha256 of the typical pods themselves: two models' pods differ whatever their source is called."""
    return hashlib.sha256(json.dumps(typical.to_json(), sort_keys=True).encode()).hexdigest()


@dataclass(frozen=True)
class _TypicalRead:
    """A typical pods file as read with the policy file that names it, and the :func:`typical_digest`
    of its pods, computed by the same thread (:meth:`PolicyEngine.poll`'s worker): the fallback is keyed
    by it, and the event loop does not pay for it (~3 ms for :data:`MAX_TYPICAL_GROUPS` groups)."""

    pods: TypicalPods | ConfigError
    """The typical pods, or why the file could not be read (whether that matters is decided when the
    typical pods are used)."""
    digest: str = ""
    """:func:`typical_digest` of ``pods`` ("" for an error)."""


def _read_typical(path: str) -> _TypicalRead:
    """:func:`load_typical` and the digest of what it read; its ConfigError returned instead of raised."""
    try:
        pods = load_typical(path)
    except ConfigError as exc:
        return _TypicalRead(exc)
    return _TypicalRead(pods, typical_digest(pods))


def _warm_fallback(name: str, typical: TypicalPods) -> Scorer:
    """A fallback scorer, built and warmed up (any thread)."""
    fallback = make_scorer(name, typical)
    warm_up(fallback)
    return fallback


def file_sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _digest_error(path: str, actual: str, expected: str) -> str:
    """The load error of a model file whose bytes are not the ones ``modelSha256`` names."""
    return f"sha256 mismatch: {path} has sha256 {actual}, modelSha256 expects {expected}; not loaded"


def _stat_key(path: str | None) -> tuple[Any, ...] | None:
    if not path:
        return None
    try:
        st = os.stat(path)
    except OSError:
        return ("missing",)
    return (st.st_mtime_ns, st.st_size, st.st_ino)


ModelLoader = Callable[[str, TypicalPods], Scorer]

_PREPARED_MAX = 2
"""Fallbacks kept built ahead (:meth:`PolicyEngine._prepare`): the pending file's and its model's."""


def _read_policy_file(path: str, base: PolicySettings) -> tuple[PolicySettings, _TypicalRead | None]:
    """The policy file, and the typical pods file it names (None: it names none), read in a worker thread."""
    settings = load_policy_file(path, base)
    typical_path = settings.typical_pods_path
    return settings, _read_typical(typical_path) if typical_path else None


def load_model(path: str, typical: TypicalPods | None = None) -> Scorer:
    """The default model loader: ``make_scorer("ppo:PATH")`` (rlsched.policy.learned).

    The model computes its features with the typical pods stored in its manifest (``typical`` is
    not passed on): a policy must see the workload model it was trained with."""
    return make_scorer(f"ppo:{path}", None)


def warm_up(scorer: Scorer) -> None:
    """A few decisions on a tiny cluster: compiles numba kernels and fills caches before the first
    real request (the first FGD call costs ~150 ms), and proves the scorer can decide at all."""
    from rlsched.policy.cluster import NodeSpec, PodSpec

    state = ClusterState(
        [
            NodeSpec("warm-a", 32000, 131072, 4, "V100M16"),
            NodeSpec("warm-b", 32000, 131072, 8, "T4"),
            NodeSpec("warm-c", 16000, 65536),
        ]
    )
    tiebreak = TieBreak.by_name(state.names)
    for pod in (
        PodSpec("share", 2000, 4096, 1, 500),
        PodSpec("whole", 4000, 8192, 2, 1000),
        PodSpec("cpu", 1000, 1024),
    ):
        req = state.request(pod)
        decision = decide(scorer, state, req, tiebreak, nodes=np.arange(state.num_nodes))
        if decision is not None:
            state.place(req, decision.node, decision.cards)


def model_typical(scorer: Scorer) -> TypicalPods | None:
    """The typical pods a model was trained with, when the scorer exposes them."""
    for attr in ("typical", "typical_pods"):
        value = getattr(scorer, attr, None)
        if isinstance(value, TypicalPods):
            return value
    manifest = getattr(scorer, "manifest", None)
    if isinstance(manifest, dict):
        entries = manifest.get("typicalPods") or manifest.get("typical_pods")
        if isinstance(entries, list):
            try:
                return TypicalPods.from_json(entries)
            except ValueError:
                return None
    return None


class PolicyEngine:
    """Scorers, settings and their hot reload; :meth:`decide` for the verbs.

    **One generation in effect.** The settings in effect (``settings``: mode, fallback, deadline, …)
    and the model in effect (``model``) always come from the same policy file. A new policy file that
    names the model already loaded (same path, same bytes, a ``modelSha256`` that matches them), or no
    model, takes effect at once. One that names another model (another path, a changed file, other
    bytes by its ``modelSha256``) is *pending* (``pending``, ``/status`` ``pending``) until that model
    has loaded and passed its test decision; then its settings and its model are swapped in together.
    Until then the previous settings and model serve on unchanged — their mode included — and if the
    model fails to load they keep serving (the pending file waits for its model file to change, or for
    another policy file — the operator's rollback). So a model approved only for ``shadow`` never
    places a pod because the next file says ``active`` with another model; and a model approved
    ``active`` is not demoted before its successor is ready: active A → (shadow, B) keeps A active
    until B has loaded, then B shadows (a file that changes the mode alone, same model, applies at
    once). At start there is no previous generation: the file's settings apply even when its model
    fails to load, and the fallback serves until the model loads."""

    def __init__(
        self,
        settings: PolicySettings,
        policy_file: str | None = None,
        model_loader: ModelLoader = load_model,
        metrics: Any = None,
        clock: Callable[[], float] = time.time,
    ):
        self.settings = settings
        self.base_settings = settings
        self.policy_file = policy_file
        self.model_loader = model_loader
        self.metrics = metrics
        self.clock = clock
        self.model: Scorer | None = None
        self.model_info = ModelInfo()
        self.settings_error: str | None = None
        self._cards_failed: set[str | None] = set()
        self.settings_loaded_at: float | None = None
        self._file_key: tuple[Any, ...] | None = None
        self._model_key: tuple[Any, ...] | None = None
        self._failed: _FailedFile | None = None
        """A model file that failed to load: not retried until it changes."""
        self._failed_shown_for: PolicySettings | None = None
        """The settings under which ``_failed``'s error was last shown in ``model_info``."""
        self.pending: PolicySettings | None = None
        """The last policy file read, while it is not in effect: it names a model other than the one in
        effect, which has not loaded (yet). ``settings`` and ``model`` serve on meanwhile."""
        self.pending_since: float | None = None
        """When ``pending`` was read (``clock``)."""
        self.pending_state: str | None = None
        """``loading`` (its model is being loaded), ``failed`` (its model failed: ``pending_error``; tried
        again when the file changes) or ``waiting`` (before the first load; or it names the serving
        file, unchanged, with a ``modelSha256`` of other bytes: tried when the file changes)."""
        self.pending_error: str | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rlsched-policy")
        self._running: asyncio.Future[Any] | None = None
        """The model call in the worker thread (thread mode), until it ends — past its deadline too."""
        self.busy_since: float | None = None
        """Monotonic time the current worker call started (None: idle); /status shows a stuck one."""
        self._timer = DeadlineTimer()
        self.counters: dict[str, int] = {
            "decisions": 0,
            "policy": 0,
            "fallback": 0,
            "shadowAgree": 0,
            "shadowDisagree": 0,
        }
        self.fallbacks: dict[str, int] = dict.fromkeys(FALLBACK_REASONS, 0)
        self._builtin_typical = default_typical()
        self._builtin_digest = typical_digest(self._builtin_typical)
        self.typical_source = "built-in"
        self.typical = self._builtin_typical
        """The typical pods the fallback scorer uses (``/status`` ``typicalPods``)."""
        self._fallback_key = (canonical_name(settings.fallback), self._builtin_digest)
        """(fallback name, :func:`typical_digest` of its typical pods) of ``fallback_scorer``."""
        self.fallback_scorer = _warm_fallback(self._fallback_key[0], self.typical)
        self._typical_files: list[tuple[PolicySettings, _TypicalRead]] = []
        """The ``typicalPodsPath`` of each settings object in use (in effect, pending, base), as read with
        the policy file that named it — off the event loop, by :meth:`poll` — matched by identity."""
        self._prepared: dict[tuple[str, str], Scorer] = {}
        """Fallbacks built and warmed off the event loop for settings about to take effect, by
        ``_fallback_key``; the oldest dropped past :data:`_PREPARED_MAX`."""

    # -- start-up and reload ----------------------------------------------------------------------
    def start(self, strict_model: bool = True) -> None:
        """Load the policy file and the model synchronously. With ``strict_model`` a bad policy file
        or a model that cannot be loaded raises ConfigError; without it each is reported (``/status``,
        metrics, the log) and the extender starts on the base settings or the fallback, and applies
        the file or the model once it is fixed — a bad file written by the operator must not put the
        scheduler's extender into a crash loop."""
        if self.policy_file:
            self._file_key = _stat_key(self.policy_file)
            try:
                self.settings = self._start_up_seed(load_policy_file(self.policy_file, self.base_settings))
                self.settings_loaded_at = self.clock()
            except Exception as exc:  # noqa: BLE001 - as poll: whatever reading it raised rejects the file
                if strict_model:
                    raise
                self._policy_file_failed(exc, "starting on the base settings")
        try:
            self._apply_typical_and_fallback(self.settings, None)
        except ConfigError as exc:  # the policy file's typicalPodsPath cannot be read
            if strict_model or self.settings is self.base_settings:
                raise
            self._policy_file_failed(exc, "starting on the base settings")
            self.settings = self.base_settings
            self._apply_typical_and_fallback(self.settings, None)
        if self.settings.model_path:
            key = _stat_key(self.settings.model_path)
            scorer, info = self._load(self.settings.model_path, self.settings.model_sha256)
            if scorer is None:
                if strict_model:
                    raise ConfigError(f"model {self.settings.model_path}: {info.error}")
                # As poll does after a failed load: the error stays reported, and the file is tried
                # again once it changes.
                self._failed = _FailedFile(
                    self.settings.model_path,
                    key,
                    self.settings.model_sha256,
                    info.error or "",
                    info.error_kind or "load",
                )
                self._failed_shown_for = self.settings
                self.model_info = info
                self._count("rlsched_model_reloads_total", "error")
                log.error(
                    "model %s not loaded (%s); the fallback %s serves",
                    info.path,
                    info.error,
                    self.fallback_scorer.name,
                    extra={"event": "model_load_failed"},
                )
            else:
                self._model_key = key
                self._install(scorer, info)
        self._report()

    def _load(self, path: str, expected_sha256: str | None = None) -> tuple[Scorer | None, ModelInfo]:
        """Load a model (any thread). Never raises: the error goes into the returned info.

        With ``expected_sha256`` (the policy file's ``modelSha256``) a file with other bytes is
        refused before the loader reads it: unreviewed bytes never serve."""
        info = ModelInfo(path=path, error_path=path, error_kind="load")
        try:
            st = os.stat(path)
            if not stat.S_ISREG(st.st_mode):  # a device or a FIFO (/dev/zero) would never end
                raise ValueError(f"{path} is not a regular file")
            if st.st_size > MAX_MODEL_BYTES:
                raise ValueError(f"{path} is larger than {MAX_MODEL_BYTES:,} bytes; it is not an rlsched model")
            info.file_digest = file_sha256(path)
            if expected_sha256 and info.file_digest != expected_sha256:
                info.error, info.error_kind = _digest_error(path, info.file_digest, expected_sha256), "digest"
                info.error_at = self.clock()
                return None, info
            scorer = self.model_loader(path, self.typical)
        except ImportError as exc:
            info.error = f"learned policies are not available in this installation ({exc})"
            info.error_at = self.clock()
            return None, info
        except Exception as exc:  # noqa: BLE001 - any load failure means "no model, use the fallback"
            info.error = f"{type(exc).__name__}: {exc}"
            info.error_at = self.clock()
            return None, info
        try:
            warm_up(scorer)
        except Exception as exc:  # noqa: BLE001 - a model that cannot decide is not loaded
            info.error = f"the model failed a test decision: {type(exc).__name__}: {exc}"
            info.error_at = self.clock()
            return None, info
        info.version = str(getattr(scorer, "version", None) or Path(path).stem)
        info.digest = str(getattr(scorer, "digest", None) or info.file_digest)
        info.loaded_at = self.clock()
        info.error_path = info.error_kind = None
        return scorer, info

    @property
    def _busy(self) -> bool:
        return self._running is not None

    def _install(self, scorer: Scorer | None, info: ModelInfo) -> None:
        """At start: ``scorer`` becomes the model of the settings already in effect."""
        self._swap_model(scorer, info)
        if scorer is not None:
            self._apply_typical_and_fallback(self.settings, scorer)
        self._log_loaded(info)

    def _swap_model(self, scorer: Scorer | None, info: ModelInfo) -> None:
        if self._running is not None:
            # The previous model is still inside a call past its deadline (hung, perhaps): a thread
            # cannot be stopped, but the new model gets a worker of its own instead of waiting for it.
            self._executor.shutdown(wait=False)
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rlsched-policy")
            self._running, self.busy_since = None, None
        self.model = scorer
        self.model_info = info

    @staticmethod
    def _log_loaded(info: ModelInfo) -> None:
        log.info(
            "model %s loaded: version %s digest %s",
            info.path,
            info.version,
            (info.digest or "")[:12],
            extra={"event": "model_loaded", "version": info.version, "digest": info.digest},
        )

    def _start_up_seed(self, settings: PolicySettings) -> PolicySettings:
        """``settings`` (from the policy file) with the start-up ``seed``: the node tie-break order is the
        cache's, fixed for the process from the config's ``policy.seed``, so a policy file's ``seed`` is
        not applied. One that differs is logged and counted (``rlsched_extender_policy_reloads_total``
        ``{result="key-ignored"}``) once per file read; the rest of the file applies."""
        seed = self.base_settings.seed
        if settings.seed == seed:
            return settings
        log.warning(
            "policy file %s: seed %s ignored: the seed is read at start-up only (the config's policy.seed, %s, "
            "stays in effect); the rest of the file applies",
            self.policy_file,
            settings.seed,
            seed,
            extra={"event": "policy_key_ignored"},
        )
        self._count("rlsched_policy_reloads_total", "key-ignored")
        return replace(settings, seed=seed)

    def _typical_file(self, settings: PolicySettings, path: str) -> TypicalPods | ConfigError:
        """``settings``' typical pods file as read with its policy file; read here (on the caller's
        thread) only for settings :meth:`poll` did not read (the base settings at start)."""
        for known, read in self._typical_files:
            if known is settings:
                return read.pods
        read = _read_typical(path)
        self._remember_typical(settings, read)
        return read.pods

    def _remember_typical(self, settings: PolicySettings, read: _TypicalRead) -> None:
        """``read`` is ``settings``' typical pods file from now on (a policy file that is missing yet
        gives the base settings again: their file is read again with it)."""
        self._typical_files = [(s, r) for s, r in self._typical_files if s is not settings]
        self._typical_files.append((settings, read))

    def _digest(self, typical: TypicalPods) -> str:
        """:func:`typical_digest` of ``typical``: for a typical pods file, the one computed when it was
        read (off the loop, by :meth:`poll`), for the built-in pods the one of start-up; computed now only
        for a model's pods (at most ``MAX_TYPICAL_PODS`` of them)."""
        if typical is self._builtin_typical:
            return self._builtin_digest
        for _, read in self._typical_files:
            if read.pods is typical:
                return read.digest
        return typical_digest(typical)

    def _keep_typical_files(self) -> None:
        """Forget the typical pods files of settings no longer in use."""
        live = (self.settings, self.pending, self.base_settings)
        self._typical_files = [(s, r) for s, r in self._typical_files if any(s is x for x in live)]

    def _typical_for(self, settings: PolicySettings, model: Scorer | None) -> tuple[TypicalPods, str]:
        """The typical pods (and their source) for ``settings`` with ``model``; ConfigError when the
        settings' ``typicalPodsPath`` is needed and could not be read. Reads no file for settings that
        :meth:`poll` read (it read their file off the event loop with the policy file)."""
        if model is not None:
            typical = model_typical(model)
            if typical is not None:
                return typical, "model"
        path = settings.typical_pods_path
        if path:
            read = self._typical_file(settings, path)
            if isinstance(read, ConfigError):
                raise ConfigError(str(read))
            return read, path
        return self._builtin_typical, "built-in"

    def _fallback_for(self, settings: PolicySettings, typical: TypicalPods) -> tuple[tuple[str, str], Scorer | None]:
        """The fallback's key for ``settings`` with ``typical``, and a new fallback scorer when it is not
        the key of the one serving (else None). The typical pods themselves are compared, not their
        source: two models' manifests are both "model". Built here (warm-up included) unless
        :meth:`_prepare` built it off the loop."""
        key = (canonical_name(settings.fallback), self._digest(typical))
        if key == self._fallback_key:
            return key, None
        fallback = self._prepared.pop(key, None)
        return key, fallback if fallback is not None else _warm_fallback(key[0], typical)

    def _set_fallback(self, typical: TypicalPods, source: str, key: tuple[str, str], fallback: Scorer | None) -> None:
        """The typical pods and fallback in effect (``fallback`` None: the one serving has ``key``)."""
        self.typical, self.typical_source = typical, source
        if fallback is not None:
            self.fallback_scorer, self._fallback_key = fallback, key

    def _apply_typical_and_fallback(self, settings: PolicySettings, model: Scorer | None) -> None:
        typical, source = self._typical_for(settings, model)
        self._set_fallback(typical, source, *self._fallback_for(settings, typical))

    async def _prepare(self, settings: PolicySettings, model: Scorer | None) -> None:
        """Build and warm up, in a worker thread, the fallback ``settings`` with ``model`` will need, so
        that putting them in effect does not do it on the event loop (the first FGD call costs ~150 ms).
        Only a cache: a failure here is met again, and handled, where the fallback is put in effect."""
        try:
            typical, _ = self._typical_for(settings, model)
            key = (canonical_name(settings.fallback), self._digest(typical))
        except Exception:  # noqa: BLE001 - handled where the settings take effect
            return
        if key == self._fallback_key or key in self._prepared:
            return
        try:
            fallback = await asyncio.get_running_loop().run_in_executor(None, _warm_fallback, key[0], typical)
        except Exception:  # noqa: BLE001 - as above
            return
        self._prepared[key] = fallback
        while len(self._prepared) > _PREPARED_MAX:
            del self._prepared[next(iter(self._prepared))]

    def _take_effect(self, settings: PolicySettings, model: tuple[Scorer | None, ModelInfo] | None = None) -> bool:
        """Put ``settings`` in effect together with ``model`` (scorer, info; None: the model in effect
        stays) and the fallback they name — in one step, with no await in between, so that no decision
        sees the settings of one policy file with the model of another (class docstring). False when
        the typical pods it needs cannot be read: the file is rejected, what was in effect stays."""
        scorer = self.model if model is None else model[0]
        try:
            typical, source = self._typical_for(settings, scorer)
            key, fallback = self._fallback_for(settings, typical)
        except ConfigError as exc:
            if settings is self.pending:
                self._clear_pending()
            self._policy_file_failed(exc, "keeping the previous settings and model")
            return False
        if model is not None:
            self._swap_model(*model)
        self._set_fallback(typical, source, key, fallback)
        changed = settings != self.settings
        self.settings, self.settings_loaded_at = settings, self.clock()
        if settings is self.pending:
            self._clear_pending()
        if changed:
            log.info(
                "policy settings in effect: mode=%s model=%s fallback=%s",
                settings.mode,
                settings.model_path,
                settings.fallback,
                extra={"event": "policy_reloaded"},
            )
        self._report()
        return True

    def _clear_pending(self) -> None:
        self.pending, self.pending_since, self.pending_state, self.pending_error = None, None, None, None

    async def poll(self) -> None:
        """Check the policy file and the model file once; reload what changed.

        A new policy file naming a model other than the one in effect is pending until that model has
        loaded; then both take effect at once (class docstring)."""
        loop = asyncio.get_running_loop()
        if self.policy_file:
            key = _stat_key(self.policy_file)
            if key != self._file_key:
                self._file_key = key
                read_before = list(self._typical_files)
                try:  # read and parsed off the event loop: a file is up to MAX_YAML_BYTES of YAML, and
                    # its typicalPodsPath up to MAX_TYPICAL_BYTES of JSON (a FIFO there is refused unread)
                    new, typical = await loop.run_in_executor(
                        None, _read_policy_file, self.policy_file, self.base_settings
                    )
                    new = self._start_up_seed(new)
                    if typical is not None:
                        self._remember_typical(new, typical)
                    # The model the file will have: none without modelPath; else the one in effect until
                    # another has loaded (then its fallback is prepared again, below).
                    model = self.model if new.model_path else None
                    self._typical_for(new, model)  # an unreadable typicalPodsPath rejects the file
                except Exception as exc:  # noqa: BLE001 - whatever reading it raised rejects the file (not CancelledError)
                    self._typical_files = read_before  # a rejected file changes nothing (base settings again)
                    self._policy_file_failed(exc, "keeping the previous settings")
                else:
                    self.settings_error = None
                    self._count("rlsched_policy_reloads_total", "ok")
                    # Pending until its model is known to be the one in effect, or has loaded (below).
                    self.pending, self.pending_since = new, self.clock()
                    self.pending_state, self.pending_error = "waiting", None
                    self._keep_typical_files()
                    await self._prepare(new, model)
        target = self.pending if self.pending is not None else self.settings
        path = target.model_path
        if not path:
            if self.model is not None:
                if self._take_effect(target, (None, ModelInfo())):
                    self._model_key = None
                    log.info("model unloaded (no modelPath)", extra={"event": "model_unloaded"})
            elif target is self.pending:
                self._take_effect(target)
            return
        key = _stat_key(path)
        expected = target.model_sha256
        failed = self._failed
        if failed is not None and (failed.path, failed.key, failed.sha256) == (path, key, expected):
            if self.model is None and target is self.pending:
                self._take_effect(target)  # no model in effect before or after: nothing to mix
            self._show_failed_again(failed, target)
            return  # the same bytes failed before; wait for the file to change
        if self.model is not None and path == self.model_info.path and key == self._model_key:
            if target is self.pending:
                if expected is not None and expected != self.model_info.file_digest:
                    # A new modelSha256 for the unchanged serving file is no load: the file named may be
                    # on its way. The file is checked when it changes; until then nothing of this policy
                    # file takes effect (its model is not loaded), and /status shows the serving
                    # model's fileDigest next to ``pending`` (whoever published the digest compares them).
                    return
                if not self._take_effect(target):
                    return
            if self.model_info.error is not None:  # back to the serving file after a failed other one
                self._clear_error()
            return
        args = (path,) if expected is None else (path, expected)  # the one-argument call without a digest
        if target is self.pending:
            self.pending_state = "loading"
        scorer, info = await loop.run_in_executor(None, self._load, *args)
        if scorer is not None and (self.pending if self.pending is not None else self.settings) is target:
            await self._prepare(target, scorer)
        if (self.pending if self.pending is not None else self.settings) is not target:
            return  # another poll applied or read a newer policy file meanwhile; the next poll goes on
        if scorer is None:
            self._failed = _FailedFile(path, key, expected, info.error or "", info.error_kind or "load")
            self._failed_shown_for = target
            self.model_info = (
                replace(
                    self.model_info,
                    error=info.error,
                    error_at=info.error_at,
                    error_path=path,
                    error_kind=info.error_kind,
                )
                if self.model
                else info
            )
            if target is self.pending:
                self.pending_state, self.pending_error = "failed", info.error
                if self.model is None:  # no model in effect before or after: its settings apply
                    self._take_effect(target)
            self._count("rlsched_model_reloads_total", "error")
            log.error(
                "model %s not loaded (%s); %s",
                path,
                info.error,
                self._what_serves(target),
                extra={"event": "model_load_failed"},
            )
        elif info.file_digest == self.model_info.file_digest and self.model is not None:
            if target is self.pending and not self._take_effect(target):
                return
            self._model_key, self._failed = key, None
            self.model_info.path = path  # touched, same bytes (restored after a bad write, say)
            self._clear_error()
        else:
            if target is self.pending:
                if not self._take_effect(target, (scorer, info)):
                    return
            else:  # the file of the settings in effect changed: the new bytes serve under them
                self._swap_model(scorer, info)
                try:
                    self._apply_typical_and_fallback(self.settings, scorer)
                except ConfigError as exc:  # a model without typical pods, the settings' file unreadable
                    log.warning(
                        "model %s has no typical pods and %s; the fallback keeps its typical pods",
                        path,
                        exc,
                        extra={"event": "typical_pods_kept"},
                    )
            self._model_key, self._failed = key, None
            self._log_loaded(info)
            self._count("rlsched_model_reloads_total", "ok")
        self._report()

    def _what_serves(self, target: PolicySettings) -> str:
        """For the log line of a model that failed: what serves instead."""
        if target is not self.pending:
            return "the previous model keeps serving" if self.model else "the fallback serves"
        serving = f"model {self.model_info.version}" if self.model else "no model (the fallback serves)"
        return f"the policy file waits for it; the previous settings (mode {self.settings.mode}) and {serving} stay"

    def _policy_file_failed(self, exc: Exception, what_now: str) -> None:
        """The policy file (or the typical pods file it names) is not applied: shown in /status, counted
        and logged, once per file read. An error other than ConfigError (a parser defeated by the file,
        a defect) is shown with its type, and logged with its traceback."""
        unexpected = not isinstance(exc, ConfigError)
        message = f"policy file {self.policy_file}: {type(exc).__name__}: {str(exc)[:400]}" if unexpected else str(exc)
        self.settings_error = message
        self._count("rlsched_policy_reloads_total", "error")
        log.error(
            "policy file not applied, %s: %s",
            what_now,
            message,
            exc_info=exc if unexpected else None,
            extra={"event": "policy_reload_failed"},
        )

    def _show_failed_again(self, failed: _FailedFile, target: PolicySettings) -> None:
        """The policy file names a file that failed before and has not changed: not loaded again,
        but its error is shown again — fresh, with ``errorPath`` — once per policy file that names
        it. Whoever published that file (the operator, verifying a rollout) learns at once that it
        fails, instead of waiting for a load that never comes (the error may have been cleared
        meanwhile by a rollback to the serving file)."""
        if self._failed_shown_for is target:
            return
        self._failed_shown_for = target
        now = self.clock()
        if target is self.pending:
            self.pending_state, self.pending_error = "failed", failed.error
        if self.model is not None:
            self.model_info = replace(
                self.model_info, error=failed.error, error_at=now, error_path=failed.path, error_kind=failed.kind
            )
        else:
            self.model_info = ModelInfo(
                path=failed.path, error=failed.error, error_at=now, error_path=failed.path, error_kind=failed.kind
            )
        log.error(
            "model %s not loaded (unchanged since it failed: %s); %s",
            failed.path,
            failed.error,
            self._what_serves(target),
            extra={"event": "model_load_failed"},
        )
        self._report()

    def _clear_error(self) -> None:
        """The serving model's file is as it was loaded: an error about another version is history."""
        self.model_info = replace(self.model_info, error=None, error_at=None, error_path=None, error_kind=None)
        self._report()

    async def run_poller(self, interval_s: float) -> None:
        """Background task: :meth:`poll` every ``interval_s``."""
        while True:
            await asyncio.sleep(interval_s)
            try:
                await self.poll()
            except Exception:  # noqa: BLE001 - a reload must never kill the poller
                log.exception("policy poll failed", extra={"event": "policy_poll_failed"})

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)

    # -- deciding ---------------------------------------------------------------------------------
    async def decide(self, state: ClusterState, tiebreak: TieBreak, req: PodRequest, nodes: np.ndarray) -> Outcome:
        """The node and cards for ``req`` among ``nodes`` (indices), with fallback (module docstring)."""
        settings = self.settings
        self.counters["decisions"] += 1
        model = self.model
        version = self.model_info.version if model is not None else None
        if settings.mode == "active" and model is not None:
            if self._busy:
                outcome = self._fallback(state, tiebreak, req, nodes, "busy", version)
            else:
                outcome = await self._run_policy(model, state, tiebreak, req, nodes, settings.deadline_ms / 1e3)
                if outcome.fallback_reason is None:
                    self.counters["policy"] += 1
                    return outcome
                outcome = self._fallback(
                    state, tiebreak, req, nodes, outcome.fallback_reason, version, outcome.error, outcome.policy_ms
                )
            return outcome
        reason = {"active": "no-model", "shadow": "mode-shadow", "off": "mode-off"}[settings.mode]
        return self._fallback(state, tiebreak, req, nodes, reason, version)

    async def _run_policy(
        self,
        model: Scorer,
        state: ClusterState,
        tiebreak: TieBreak,
        req: PodRequest,
        nodes: np.ndarray,
        deadline_s: float,
    ) -> Outcome:
        start = time.perf_counter()
        version = self.model_info.version
        try:
            if self.settings.deadline_enforcement == "timer" and self._timer.usable():
                decision, verdict = self._timer.run(
                    lambda: _policy_call(model, state, tiebreak, req, nodes), deadline_s
                )
            else:
                loop = asyncio.get_running_loop()
                future = loop.run_in_executor(self._executor, _policy_call, model, state, tiebreak, req, nodes)
                self._running, self.busy_since = future, time.monotonic()
                future.add_done_callback(self._not_busy)
                decision, verdict = await asyncio.wait_for(asyncio.shield(future), deadline_s)
        except (TimeoutError, PolicyDeadline):
            return Outcome(
                None,
                "fallback",
                self.fallback_scorer.name,
                "deadline",
                policy_ms=(time.perf_counter() - start) * 1e3,
                error=f"policy took longer than {deadline_s * 1e3:.0f} ms",
                model_version=version,
            )
        except Exception as exc:  # noqa: BLE001 - any policy failure → fallback
            reason = "bad-output" if isinstance(exc, BadOutput) else "error"
            if reason == "error":
                log.warning("policy failed: %s: %s", type(exc).__name__, exc, extra={"event": "policy_error"})
            return Outcome(
                None,
                "fallback",
                self.fallback_scorer.name,
                reason,
                policy_ms=(time.perf_counter() - start) * 1e3,
                error=f"{type(exc).__name__}: {exc}",
                model_version=version,
            )
        ms = (time.perf_counter() - start) * 1e3
        return Outcome(decision, "policy", model.name, None, verdict=verdict, policy_ms=ms, model_version=version)

    def _not_busy(self, future: Any) -> None:
        if self._running is future:  # not a call of a worker abandoned by a reload
            self._running, self.busy_since = None, None

    def _fallback(
        self,
        state: ClusterState,
        tiebreak: TieBreak,
        req: PodRequest,
        nodes: np.ndarray,
        reason: str,
        version: str | None,
        error: str = "",
        policy_ms: float | None = None,
    ) -> Outcome:
        self.counters["fallback"] += 1
        self.fallbacks[reason] += 1
        if self.metrics is not None:
            self.metrics.fallbacks.labels(reason).inc()
        decision = decide(self.fallback_scorer, state, req, tiebreak, nodes=nodes)
        return Outcome(
            decision,
            "fallback",
            self.fallback_scorer.name,
            reason,
            policy_ms=policy_ms,
            error=error,
            model_version=version,
        )

    def cards_on(self, state: ClusterState, tiebreak: TieBreak, req: PodRequest, node: int) -> tuple[int, ...] | None:
        """Cards for ``req`` on ``node`` by the serving scorer's card rule (None if it does not fit).

        Used by bind when the node kube-scheduler picked is not the one filter's decision chose.
        """
        nodes = np.array([node])
        model = self.model
        # Only under the timer: in thread mode the model may be deciding in its worker thread right
        # now (it is not safe to call twice at once), and a call here would have no deadline.
        if self.settings.mode == "active" and model is not None and self._timer_mode() and not self._busy:
            try:
                decision, _ = self._timer.run(
                    lambda: _policy_call(model, state, tiebreak, req, nodes), self.settings.deadline_ms / 1e3
                )
                if decision is not None:
                    return decision.cards
            except (Exception, PolicyDeadline) as exc:  # noqa: BLE001 - the model failing must not fail the bind
                version = self.model_info.version
                if version not in self._cards_failed:
                    self._cards_failed.add(version)
                    log.warning(
                        "model %s could not choose cards at bind (%s); the fallback's card rule chose them "
                        "(logged once per model version)",
                        version,
                        exc if isinstance(exc, Exception) else "deadline",
                        extra={"event": "cards_fallback"},
                    )
        decision = decide(self.fallback_scorer, state, req, tiebreak, nodes=nodes)
        return None if decision is None else decision.cards

    def _timer_mode(self) -> bool:
        return self.settings.deadline_enforcement == "timer" and self._timer.usable()

    def without_load(
        self, state: ClusterState, tiebreak: TieBreak, req: PodRequest, nodes: np.ndarray, served: Outcome
    ) -> dict[str, Any] | None:
        """The node the scorer that served ``served`` picks for the same pod with node load unknown
        (``explainLoad``); None when load was not known or nothing was placed.

        Runs on the event loop right after the decision, before anything changes the state: load is
        swapped out and back with nothing else running in between. A failing scorer gives
        ``{"error": ...}``, never an exception.
        """
        decision = served.decision
        if decision is None or np.isnan(state.load).all():
            return None
        scorer = self.model if served.served_by == "policy" and self.model is not None else self.fallback_scorer
        load, load_std = state.load, state.load_std
        state.load, state.load_std = np.full_like(load, np.nan), np.full_like(load_std, np.nan)
        try:
            other = decide(scorer, state, req, tiebreak, nodes=nodes)
        except Exception as exc:  # noqa: BLE001 - an explanation must never fail the decision
            return {"error": f"{type(exc).__name__}: {exc}"}
        finally:
            state.load, state.load_std = load, load_std
        node = other.node if other is not None else None
        changed = node != decision.node
        if self.metrics is not None:
            self.metrics.load_explained.labels("true" if changed else "false").inc()
        return {"node": state.names[node] if node is not None else None, "changed": changed}

    async def shadow(
        self, state: ClusterState, tiebreak: TieBreak, req: PodRequest, nodes: np.ndarray, served: Outcome
    ) -> dict[str, Any] | None:
        """In shadow mode: what the policy would have done (after the answer went out)."""
        model = self.model
        if self.settings.mode != "shadow" or model is None or self._busy:
            return None
        result = await self._run_policy(model, state, tiebreak, req, nodes, self.settings.deadline_ms / 1e3)
        served_node = served.decision.node if served.decision is not None else None
        if result.fallback_reason is not None:
            return {"error": result.error, "reason": result.fallback_reason}
        node = result.decision.node if result.decision is not None else None
        agree = node == served_node
        self.counters["shadowAgree" if agree else "shadowDisagree"] += 1
        if self.metrics is not None:
            self.metrics.shadow.labels("agree" if agree else "disagree").inc()
        out: dict[str, Any] = {
            "node": state.names[node] if node is not None else None,
            "agree": agree,
            "policyMs": round(result.policy_ms or 0.0, 3),
        }
        if result.decision is not None:
            out["cards"] = list(result.decision.cards)
        if result.verdict is not None:
            out["verdict"] = result.verdict.action
        return out

    # -- reporting --------------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        s = self.settings
        info = self.model_info
        return {
            "mode": s.mode,
            "fallback": self.fallback_scorer.name,
            "deadlineMs": s.deadline_ms,
            "topK": s.top_k,
            "policyFile": self.policy_file,
            "policyFileError": self.settings_error,
            "typicalPods": {"source": self.typical_source, "count": len(self.typical)},
            "model": {
                "path": info.path,
                "loaded": self.model is not None,
                "version": info.version,
                "digest": info.digest,
                "loadedAt": info.loaded_at,
                "fileDigest": info.file_digest if self.model is not None else None,
                "error": info.error,
                "errorAt": info.error_at,
                "errorPath": info.error_path if info.error else None,
                "errorKind": info.error_kind if info.error else None,
            },
            # A policy file read but not in effect: its model has not loaded (yet); everything above
            # is still the previous file's, mode included (PolicyEngine's docstring).
            "pending": self._pending_status(),
            "counters": dict(self.counters),
            "fallbacks": dict(self.fallbacks),
            # Thread mode: how long the model's current call has run (past the deadline, every
            # decision meanwhile goes to the fallback as "busy"); None when no call is running.
            "policyCallRunningS": None if self.busy_since is None else round(time.monotonic() - self.busy_since, 3),
        }

    def _pending_status(self) -> dict[str, Any] | None:
        p = self.pending
        if p is None:
            return None
        return {
            "mode": p.mode,
            "fallback": p.fallback,
            "modelPath": p.model_path,
            "modelSha256": p.model_sha256,
            "state": self.pending_state,
            "since": self.pending_since,
            "error": self.pending_error,
        }

    def _count(self, metric: str, result: str) -> None:
        if self.metrics is not None:
            getattr(self.metrics, "model_reloads" if "model" in metric else "policy_reloads").labels(result).inc()

    def _report(self) -> None:
        if self.metrics is not None:
            self.metrics.set_model(self.model_info if self.model is not None else None, self.settings.mode)


class PolicyDeadline(BaseException):
    """Raised inside the policy when its deadline passes (a BaseException, so that a model's own
    ``except Exception`` cannot swallow it)."""


class DeadlineTimer:
    """Runs the policy on the event loop's thread under a SIGALRM interval timer.

    The timer's handler raises :class:`PolicyDeadline` in the policy at the next bytecode boundary
    after the deadline, so a numpy policy is stopped within one array operation of it. No thread
    hop: on 2 shared cores handing the work to a thread cost ~0.2 ms p50 and ~1.5 ms p99 at 1,000
    nodes. Only usable in the main thread of a process with ``setitimer`` (otherwise the engine
    uses its worker thread and ``asyncio.wait_for``).
    """

    def __init__(self) -> None:
        self.armed = False

    @staticmethod
    def usable() -> bool:
        return hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()

    def run(self, fn: Callable[[], _T], deadline_s: float) -> _T:
        """``fn()`` under the deadline. Whatever else owned SIGALRM and the real-time timer (a test
        runner's timeout, say) gets both back afterwards, its remaining time included."""
        start = time.monotonic()
        previous_handler = signal.signal(signal.SIGALRM, self._alarm)
        try:
            previous_delay, previous_interval = signal.setitimer(signal.ITIMER_REAL, deadline_s)
        except BaseException:
            signal.signal(signal.SIGALRM, previous_handler)  # the handler is not left swapped
            raise
        self.armed = True
        try:
            return fn()
        finally:
            self.armed = False
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous_handler)
            if previous_delay > 0:
                left = max(previous_delay - (time.monotonic() - start), 1e-6)
                signal.setitimer(signal.ITIMER_REAL, left, previous_interval)

    def _alarm(self, signum: int, frame: Any) -> None:
        if self.armed:
            self.armed = False
            raise PolicyDeadline()


class BadOutput(ValueError):
    """The policy answered something unusable (NaN scores, a node it was not offered, …)."""


class _Checked(Scorer):
    """The model, with its scores checked before anything chooses by them."""

    def __init__(self, model: Scorer):
        self.model = model
        self.name = model.name  # type: ignore[misc]

    def score(self, state: ClusterState, req: PodRequest, nodes: np.ndarray) -> NodeScores:
        scores = self.model.score(state, req, nodes)
        values = np.asarray(scores.values)
        if values.shape != (len(nodes),):
            raise BadOutput(f"policy returned {values.shape} scores for {len(nodes)} nodes")
        if values.dtype.kind not in "biuf" or not np.isfinite(values.astype(np.float64)).all():
            raise BadOutput("policy returned NaN, infinite or non-numeric scores")
        if scores.cards is not None and np.asarray(scores.cards).shape != (len(nodes),):
            raise BadOutput("policy returned a card array of the wrong length")
        return scores

    def choose(self, scores: NodeScores, nodes: np.ndarray, tiebreak: TieBreak) -> int:
        return self.model.choose(scores, nodes, tiebreak)

    def cards(
        self,
        state: ClusterState,
        req: PodRequest,
        node: int,
        position: int,
        scores: NodeScores | None,
        tiebreak: TieBreak,
    ) -> tuple[int, ...]:
        return self.model.cards(state, req, node, position, scores, tiebreak)


def _policy_call(
    model: Scorer, state: ClusterState, tiebreak: TieBreak, req: PodRequest, nodes: np.ndarray
) -> tuple[Decision | None, Verdict | None]:
    """Runs in the policy thread: decide with the model, validate what it says."""
    decision = decide(_Checked(model), state, req, tiebreak, nodes=nodes)
    verdict = None
    hook = getattr(model, "verdict", None)
    if callable(hook):
        raw = hook(state, req, nodes, decision.scores if decision is not None else None)
        verdict = _as_verdict(raw)
    if decision is None:
        return None, verdict
    if not np.any(decision.feasible == decision.node):
        raise BadOutput(f"policy chose node index {decision.node}, which was not a feasible candidate")
    if len(decision.cards) != req.num_gpu or len(set(decision.cards)) != len(decision.cards):
        raise BadOutput(f"policy gave cards {decision.cards} for a pod asking {req.num_gpu}")
    return decision, verdict


def _as_verdict(raw: Any) -> Verdict | None:
    if raw is None:
        return None
    if isinstance(raw, Verdict):
        v = raw
    elif isinstance(raw, (tuple, list)) and len(raw) in (2, 3):
        v = Verdict(str(raw[0]), str(raw[1]), float(raw[2]) if len(raw) == 3 else 30.0)
    else:
        v = Verdict(str(raw.action), str(getattr(raw, "reason", "")), float(getattr(raw, "retry_after_s", 30.0)))
    if v.action not in ("delay", "reject"):
        raise BadOutput(f"policy verdict {v.action!r} is not delay or reject")
    if v.action == "delay" and not 0 < v.retry_after_s <= MAX_RETRY_AFTER_S:  # NaN and infinities too
        raise BadOutput(
            f"policy verdict holds the pod {v.retry_after_s!r} s; a hold must be more than 0 and at most "
            f"{MAX_RETRY_AFTER_S:.0f} s"
        )
    return v
