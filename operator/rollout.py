"""Model rollout: resolve the model, publish a bundle, wait until the extender reports it, roll back.

:meth:`Rollout.apply` is the whole flow for one policy generation, free of kopf (the handlers turn
its :class:`RolloutResult` into status, conditions and events):

1. :class:`ModelFetcher` resolves ``spec.model`` to bytes (ConfigMap key, URL) or a path the
   extender reads itself, checks ``sha256`` and names the file by content (``model-<sha16>.npz``);
2. the bundle goes to the sink's ``current`` slot;
3. the extender's ``GET /status`` is polled until it serves exactly that bundle (mode, fallback,
   model path, model loaded, the file's sha256 when the bundle has one — other bytes at the path are
   "not yet": the extender reads a ``path`` model on its own timer) — success: the bundle becomes
   ``last-good``;
4. a model load error newer than the publication (:func:`load_failed`; the extender dates it by its
   own node's clock), a rejected policy file, or no confirmation within ``rolloutTimeoutS`` (on the
   operator's monotonic clock: a wall clock that NTP steps neither ends nor stretches it) → the
   ``last-good`` bundle is published again (or, with none — or one that
   cannot be read —, the same settings without a model: the fallback serves), marked ``rollbackOf``
   the failed generation (and ``rollbackReason``) when its model failed (not a digest refusal, a
   rejected policy file or a timeout, which a restart tries again), and the result says what failed
   and why (a :class:`Cause` decided from ``/status``, not from words in a message);
5. an extender that does not answer — at all, or no longer at the deadline (it answered, then went
   away: a restart) — is *not* a reason to roll back: the bundle stays published (the extender picks
   it up when it is back) and the caller retries the verification. The exception is bounded: an
   extender that answered after the bundle was published and then stopped answering, on
   :data:`LOST_AFTER_PUBLISH_TRIES` tries of the generation (the caller counts them in the status;
   only an answer clears the count), is rolled back from (``ExtenderLostAfterPublish``): a model that OOM-kills the
   extender or crash-loops it while loading. The rollback's own verification then tells whether the
   old bundle brings it back.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import hashlib
import ipaddress
import logging
import os
import re
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeAlias

import aiohttp
import aiohttp.abc
import yarl

from rlsched.extender.bounded_read import AnswerTooLong, read_capped

from .extender_client import ExtenderClient, ExtenderUnavailable, ExtenderView
from .sink import CURRENT, LAST_GOOD, Bundle, ModelTooLarge, PolicySink, SinkError
from .spec import PolicySpec, redact

log = logging.getLogger("rlsched.operator.rollout")

CLOCK_SKEW_S = 300.0
"""How far the extender's clock (its node's) may run behind the operator's for a load error about the
operator's own published model file, first shown after the publication, to count as this
publication's (:func:`load_failed`): an ``errorAt`` up to this long before the publication counts.
Five minutes, the bound the rebalancer trusts a status date ahead of its clock by
(:data:`.rebalance_budget.MAX_CLOCK_SKEW_S`) and the customary Kerberos limit: nodes kept by NTP are
milliseconds apart, and minutes come only from a node whose time service is broken — and the
extender's pickup delay (a ConfigMap volume: up to the kubelet's sync period, a minute or more) no
longer counts against the tolerance. The error the extender showed just before the publication is
never taken (:data:`ErrorSeen`): the same bytes may have failed for a passing reason minutes ago, and
the extender loads a file published again afresh (a new inode), so only a new error says this
publication failed."""
FRESH_ERROR_S = 1.0
"""The same for an error that may be about other bytes than ours: a ``path`` model (the file at the
path may have been replaced since it failed: the fix a user applies minutes after a failure must not
be taken for the failure) and an error that names no file (an older extender's). Only the clocks'
rounding is tolerated: an extender more than its pickup delay behind the operator turns such a
failure into a ``RolloutTimeout`` (rolled back, without ``rollbackOf``: a restart tries it again)."""
LOST_AFTER_PUBLISH_TRIES = 3
"""Tries of one generation that end with the extender lost after the bundle was published
(it answered after the publication, then stopped answering) before the bundle is rolled back
(:attr:`Cause.LOST_AFTER_PUBLISH`). Once is an extender pod restarting, a node drained: the bundle
stays published, the extender may serve it once it is back. A model that OOM-kills the extender or
crash-loops it while loading does it on every try — and since the extender loads its model before
its status port answers, it then stays silent —, and without a bound every retry published it
again, for ever. Three tries (kopf retries every 15 s, each waits up to ``rolloutTimeoutS``: over six
minutes with the defaults) are not one restart, or two back to back."""


class SourceError(Exception):
    """The model could not be fetched. ``temporary``: worth retrying (the ConfigMap may appear)."""

    def __init__(self, reason: str, message: str, temporary: bool):
        self.reason, self.temporary = reason, temporary
        super().__init__(message)


class ModelFetcher:
    """Resolves ``spec.model`` to bytes (or to a path the extender reads)."""

    def __init__(self, kube: Any, max_bytes: int = 64 * 1024 * 1024, timeout_s: float = 30.0):
        self.kube, self.max_bytes, self.timeout_s = kube, max_bytes, timeout_s

    async def fetch(self, namespace: str, spec: PolicySpec) -> bytes | None:
        """The model's bytes; None when there is no model or it is a ``path`` model."""
        src = spec.model
        if src is None or src.path:
            return None
        if src.configmap:
            return await self._configmap(namespace, src.configmap, src.key or "")
        return await self._url(src.url or "")

    async def _configmap(self, namespace: str, name: str, key: str) -> bytes:
        import base64

        try:
            cm = await self.kube.get_configmap(namespace, name)
        except Exception as exc:  # noqa: BLE001 - API trouble: retry later
            raise SourceError(
                "ModelSourceUnavailable", f"cannot read ConfigMap {namespace}/{name}: {exc}", True
            ) from None
        if cm is None:
            raise SourceError(
                "ModelSourceNotFound",
                f"ConfigMap {namespace}/{name} not found: create it "
                f"(kubectl -n {namespace} create configmap {name} --from-file={key}=model.npz) "
                "or fix spec.model.configMapKeyRef",
                True,
            )
        if key in (cm.get("binaryData") or {}):
            return base64.b64decode(cm["binaryData"][key])
        if key in (cm.get("data") or {}):
            text: str = cm["data"][key]
            return text.encode()
        keys = sorted([*(cm.get("binaryData") or {}), *(cm.get("data") or {})])
        raise SourceError(
            "ModelSourceNotFound",
            f"ConfigMap {namespace}/{name} has no key {key!r} "
            f"(keys: {', '.join(keys) or 'none'}); fix spec.model.configMapKeyRef.key",
            True,
        )

    async def _url(self, url: str) -> bytes:
        """GET ``url`` (module docstring of :data:`MAX_REDIRECTS`): redirects followed here, each hop
        checked — http(s) only, never from https down to http, never to instance metadata."""
        shown = redact(url)
        connector = aiohttp.TCPConnector(resolver=_NoMetadataResolver())
        try:
            async with aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.timeout_s), connector=connector
            ) as session:
                target = yarl.URL(url)
                for _hop in range(MAX_REDIRECTS + 1):
                    _check_target(target, shown)
                    async with session.get(target, allow_redirects=False) as resp:
                        if resp.status in (301, 302, 303, 307, 308) and "Location" in resp.headers:
                            nxt = target.join(yarl.URL(resp.headers["Location"]))
                            if target.scheme == "https" and nxt.scheme != "https":
                                raise SourceError(
                                    "ModelSourceRedirect",
                                    f"GET {shown}: redirected from https to {nxt.scheme}: refused",
                                    False,
                                )
                            target = nxt
                            continue
                        if resp.status != 200:
                            raise SourceError(
                                "ModelSourceUnavailable",
                                f"GET {shown}: HTTP {resp.status}",
                                resp.status >= 500 or resp.status in (404, 429),
                            )
                        try:
                            return await read_capped(resp, self.max_bytes)
                        except AnswerTooLong:
                            raise SourceError(
                                "ModelTooLarge", f"GET {shown}: larger than {self.max_bytes:,} bytes", False
                            ) from None
                raise SourceError("ModelSourceRedirect", f"GET {shown}: more than {MAX_REDIRECTS} redirects", False)
        # Before ClientError: InvalidURL is one too. ValueError includes UnicodeError (a DNS label over
        # 63 characters). A URL that cannot be requested stays so: no point retrying.
        except (aiohttp.InvalidURL, ValueError) as exc:
            raise SourceError(
                "InvalidSpec",
                f"spec.model.url {shown!r:.200} cannot be requested ({type(exc).__name__}: {redact(str(exc))!s:.200}): "
                "fix it",
                False,
            ) from None
        except aiohttp.ClientConnectorError as exc:
            # Before ClientError: the resolver's MetadataAddressRefused arrives wrapped in one
            # (ClientConnectorDNSError). A name that resolves to instance metadata stays refused.
            if isinstance(exc.os_error, MetadataAddressRefused):
                raise SourceError("ModelSourceRefused", f"GET {shown}: {exc.os_error}", False) from None
            raise SourceError("ModelSourceUnavailable", f"GET {shown}: {type(exc).__name__}: {exc}", True) from None
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise SourceError("ModelSourceUnavailable", f"GET {shown}: {type(exc).__name__}: {exc}", True) from None
        except MetadataAddressRefused as exc:
            raise SourceError("ModelSourceRefused", f"GET {shown}: {exc}", False) from None


MAX_REDIRECTS = 5
"""Redirects a model URL may take. The operator follows them itself and checks every hop: only http
and https, never from https down to http, and never to a cloud's instance metadata address
(:func:`metadata_address`: where clouds serve credentials — whoever may edit the SchedulingPolicy
could otherwise have the operator fetch them and publish the answer as a model; docs/security.md)."""

METADATA_NETWORKS = (
    ipaddress.ip_network("169.254.0.0/16"),
    ipaddress.ip_network("fe80::/10"),
    ipaddress.ip_network("fd00:ec2::254/128"),
    ipaddress.ip_network("fd00:ec2::23/128"),
    ipaddress.ip_network("fd20:ce::254/128"),
    ipaddress.ip_network("100.100.100.200/32"),
)
"""Where clouds serve instance metadata and credentials: link-local IPv4 and IPv6 (AWS, GCP, Azure,
Oracle, OpenStack at 169.254.169.254, Tencent at 169.254.0.23, EKS Pod Identity at 169.254.170.23),
AWS's IPv6 endpoints (Nitro instances' metadata, EKS Pod Identity), GCP's IPv6 metadata server and
Alibaba Cloud's. Private and in-cluster addresses stay allowed: model servers live there."""

_NAT64 = (
    ipaddress.IPv6Network("64:ff9b::/96"),
    ipaddress.IPv6Network("64:ff9b:1::/48"),
    ipaddress.IPv6Network("::ffff:0:0:0/96"),
)
"""Prefixes whose addresses carry an IPv4 one in their last 32 bits: RFC 6052's well-known NAT64
prefix (a DNS64 resolver answers an IPv4-only name with it), RFC 8215's local-use NAT64 prefix (with
a /96 inside it, the common layout), and SIIT's IPv4-translated addresses (RFC 2765)."""
_IPV4_COMPATIBLE = ipaddress.IPv6Network("::/96")
"""Deprecated IPv4-compatible addresses (``::a.b.c.d``); some stacks still dial them as IPv4."""


class MetadataAddressRefused(OSError):
    """A model URL that names, or resolves only to, a cloud's instance metadata address."""


IPAddress: TypeAlias = ipaddress.IPv4Address | ipaddress.IPv6Address


def _carried_ipv4(addr: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one reaches: IPv4-mapped (``::ffff:a.b.c.d``, dialled as IPv4 by
    the kernel), 6to4 (``2002::/16``), NAT64 (``64:ff9b::/96``), IPv4-compatible (``::a.b.c.d``) or a
    Teredo client. Without this, ``[::ffff:169.254.169.254]`` passed a check of the IPv6 address alone."""
    if addr.ipv4_mapped is not None:
        return addr.ipv4_mapped
    if addr.sixtofour is not None:
        return addr.sixtofour
    if addr.teredo is not None:
        return addr.teredo[1]
    if any(addr in net for net in _NAT64) or (addr in _IPV4_COMPATIBLE and int(addr) > 1):  # not :: or ::1
        return ipaddress.IPv4Address(int(addr) & 0xFFFFFFFF)
    return None


def metadata_address(host: str) -> IPAddress | None:
    """The instance metadata address ``host`` (an IP literal, brackets and zone allowed) reaches, or
    None (also for a name: the resolver checks what it resolves to)."""
    try:
        addr: IPAddress = ipaddress.ip_address(host.strip("[]").split("%", 1)[0])
    except ValueError:
        return None
    reached = [addr]
    if isinstance(addr, ipaddress.IPv6Address) and (carried := _carried_ipv4(addr)) is not None:
        reached.append(carried)
    return next((a for a in reached for net in METADATA_NETWORKS if a in net), None)


def _check_target(target: yarl.URL, shown: str) -> None:
    if target.scheme not in ("http", "https"):
        raise SourceError("ModelSourceRedirect", f"GET {shown}: a redirect to {target.scheme}: is refused", False)
    if target.host and (reached := metadata_address(target.host)) is not None:
        via = "" if str(reached) == target.host.strip("[]") else f" (it reaches {reached})"
        raise MetadataAddressRefused(f"{target.host} is a cloud instance metadata address{via}: refused")


class _NoMetadataResolver(aiohttp.abc.AbstractResolver):
    """The default resolver, less answers that reach instance metadata (:func:`metadata_address`; a
    name that resolves only to those is refused). aiohttp calls it for names only: IP literals are
    checked by :func:`_check_target`."""

    def __init__(self) -> None:
        self._inner = aiohttp.ThreadedResolver()

    async def resolve(self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET) -> list[Any]:
        answers = await self._inner.resolve(host, port, family)
        kept = [a for a in answers if metadata_address(str(a.get("host", ""))) is None]
        if not kept:
            raise MetadataAddressRefused(f"{host} resolves only to cloud instance metadata addresses: refused")
        return kept

    async def close(self) -> None:
        await self._inner.close()


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _pinned(bundle: Bundle) -> dict[str, Any]:
    """``bundle``'s policy file with ``modelSha256`` always present: a last-good bundle written by an
    older operator left it out unless its model was a ``path`` with ``sha256``, and the extender then
    kept the digest of its own base config — refusing the model rolled back to. An empty policy file
    (the extender's own settings) stays empty."""
    settings = dict(bundle.settings)
    if settings:
        settings.setdefault("modelSha256", None)
    return settings


class Cause(enum.Enum):
    """Why a verification did not confirm its bundle, decided by :meth:`Rollout.verify` from what it
    saw (never read back out of a message: a model path with "sha256" in it is still a load error).
    The value is the reason the status and events show."""

    POLICY_FILE_REJECTED = "PolicyFileRejected"
    DIGEST_REFUSED = "DigestMismatch"
    """The extender refused the file for its sha256, or serves other bytes at the path."""
    LOAD_ERROR = "ModelLoadFailed"
    TIMEOUT = "RolloutTimeout"
    UNREACHABLE = "ExtenderUnreachable"
    LOST_AFTER_PUBLISH = "ExtenderLostAfterPublish"
    """The extender stopped answering after the bundle was published, on :data:`LOST_AFTER_PUBLISH_TRIES`
    tries (it answered after the publication; only an answer clears the count): decided by
    :meth:`Rollout.apply`, never by one verification."""

    @property
    def model_failed(self) -> bool:
        """A failure of the model itself: an operator restart does not retry it (``rollbackOf``,
        ``rollbackReason``). That is a load error, and an extender lost after the bundle was published
        try after try (publishing it again on a restart would crash the extender again). Not a digest
        refusal: its file may just not be there yet (a spec applied before the file is copied in), or
        the extender older than the digest check; nor a rejected policy file or a timeout, which may be
        the extender's (an older one during an upgrade, a volume not mounted): a restart tries those
        again."""
        return self in (Cause.LOAD_ERROR, Cause.LOST_AFTER_PUBLISH)


@dataclass(frozen=True)
class Verification:
    """How :meth:`Rollout.verify` ended: ``cause`` None when the extender serves the bundle."""

    cause: Cause | None
    view: ExtenderView | None
    """The extender's last answer (None when it never answered)."""
    message: str = ""

    @property
    def ok(self) -> bool:
        return self.cause is None

    @property
    def lost(self) -> bool:
        """Unreachable at the deadline after an answer during this verification (it started after
        the publication): the extender stopped answering after the bundle was published."""
        return self.cause is Cause.UNREACHABLE and self.view is not None


@dataclass
class RolloutResult:
    """How a rollout ended."""

    ok: bool
    reason: str
    """``RolledOut`` | ``ModelLoadFailed`` | ``PolicyFileRejected`` | ``DigestMismatch`` |
    ``RolloutTimeout`` | ``ExtenderLostAfterPublish`` | ``ExtenderUnreachable`` (``ok`` False,
    nothing rolled back)."""
    message: str
    bundle: Bundle
    view: ExtenderView | None = None
    """The extender's last answer."""
    rolled_back_to: Bundle | None = None
    rollback_ok: bool | None = None
    lost_tries: int = 0
    """``ExtenderUnreachable`` only: the tries of this generation, this one included, that
    ended with the extender lost after the bundle was published (0: it did not answer since); the
    caller passes it back as ``lost_before`` on the next try (:data:`LOST_AFTER_PUBLISH_TRIES`)."""


def bundle_label(b: Bundle | None) -> str:
    """For messages: ``model <version or digest> (generation N)`` or ``no model``."""
    if b is None:
        return "nothing"
    d = b.digest
    what = (
        f"model {b.meta.get('version') or (d[:12] if d else b.settings.get('modelPath'))}"
        if b.settings.get("modelPath")
        else "no model"
    )
    gen = b.meta.get("generation")
    return f"{what} (generation {gen})" if gen is not None else what


def serves(view: ExtenderView, bundle: Bundle, *, check_digest: bool = True) -> bool:
    """Does the extender serve exactly ``bundle``?

    A bundle with a digest is served only by a file with that sha256 (when the extender reports
    one): the same ``path`` with other bytes is not this bundle (a file replaced at the path). With
    ``check_digest`` False: everything else matches."""
    s = bundle.settings
    if not s:  # the extender's own settings: nothing to compare
        return True
    if view.mode != s.get("mode") or view.fallback != s.get("fallback"):
        return False
    if (
        s.get("deadlineMs") is not None
        and view.deadline_ms is not None
        and float(view.deadline_ms) != float(s["deadlineMs"])
    ):
        return False
    if s.get("topK") is not None and view.top_k is not None and int(view.top_k) != int(s["topK"]):
        return False
    path = s.get("modelPath")
    if path is None:
        return not view.model_loaded
    # A load error in /status may belong to another file (the extender keeps serving the previous
    # model and reports the failed one's error): only the path, "loaded" and the digest say what serves.
    if view.model_path != path or not view.model_loaded:
        return False
    return not check_digest or _digest_matches(view, bundle)


def _digest_matches(view: ExtenderView, bundle: Bundle) -> bool:
    return not bundle.digest or not view.file_digest or view.file_digest == bundle.digest


_MODEL_FILE = re.compile(r"model-[0-9a-f]{16}\.npz")


def refused_for_digest(view: ExtenderView, bundle: Bundle) -> bool:
    """Is the extender's load error its refusal of *this bundle's* file for its sha256?

    ``/status`` says so in ``model.errorKind`` (``digest``), for the file in ``errorPath``. An extender
    older than that field says it only in words: its digest refusal is one fixed sentence
    (``rlsched.extender.policy._digest_error``) naming the file and the digest it expected, matched
    whole, with our path and our digest in it, so no other error reads as one (a load error whose path
    or message merely contains "sha256")."""
    path: str | None = bundle.settings.get("modelPath")
    if not path or not bundle.digest or not view.error:
        return False
    if view.error_kind is not None:
        return view.error_kind == "digest" and view.error_path in (None, path)
    refusal = (
        f"sha256 mismatch: {re.escape(path)} has sha256 [0-9a-f]{{64}}, "
        f"modelSha256 expects {re.escape(bundle.digest)}; not loaded"
    )
    return re.fullmatch(refusal, view.error) is not None


ErrorSeen: TypeAlias = tuple[str | None, str | None, float | None]
"""The extender's last load error as ``/status`` showed it just before a publication: (error,
``errorPath``, ``errorAt``) — an earlier load's, never this publication's verdict."""


def load_failed(view: ExtenderView, bundle: Bundle, since: float, before: ErrorSeen | None = None) -> bool:
    """Did the extender fail to load *this bundle's* model after ``since`` (the publication, on the
    operator's wall clock)?

    ``/status`` shows the last load error next to the model that still serves, and the extender
    retries a failing file on every poll, so a fresh error may belong to another file (the bundle
    being rolled back from). It counts as ours when the extender names our file (``errorPath``),
    when its message names our content-addressed file (or another one), or — with neither — when
    the extender already runs our bundle's settings.

    ``errorAt`` is the extender's node's clock, ``since`` the operator's: the date keeps an error of
    an earlier load from being taken for this one. ``before``: the error the extender showed just
    before the publication (None: unknown), never taken. How much earlier than ``since`` an error may
    be dated depends on what it is about: about the operator's own published file and not the one
    shown before, :data:`CLOCK_SKEW_S` (a node clock minutes behind does not hide the failure); about
    a ``path`` model's file, naming no file, or with nothing known of before, :data:`FRESH_ERROR_S`
    (other bytes may have failed there before — the trade-off: there an extender clock behind by more
    than its pickup delay still ends in a ``RolloutTimeout``).
    """
    path: str | None = bundle.settings.get("modelPath")
    if not path or not view.error or view.error_at is None:
        return False
    if before is not None and (view.error, view.error_path, view.error_at) == before:
        return False  # shown before the publication: an earlier load's
    about = _error_about(view, bundle, path)
    if about is False:
        return False
    ours = about is True and bundle.model_name is not None and os.path.basename(path) == bundle.model_name
    return view.error_at >= since - (CLOCK_SKEW_S if ours and before is not None else FRESH_ERROR_S)


def _error_about(view: ExtenderView, bundle: Bundle, path: str) -> bool | None:
    """Is the extender's load error about our file (True), another one (False), or — naming no file —
    ours only by the extender running our bundle's settings already (None when it does, else False)?"""
    if view.model_path == path:
        # Loaded from our path, but other bytes (a ``path`` model replaced and its digest changed):
        # failed only once the extender says it refused our file — before, it may not have read it yet.
        return not view.model_loaded or (not _digest_matches(view, bundle) and view.error_path == path)
    if view.error_path:
        return view.error_path == path
    named = _MODEL_FILE.findall(view.error or "")
    if named:
        return os.path.basename(path) in named
    s = bundle.settings
    return None if view.mode == s.get("mode") and view.fallback == s.get("fallback") else False


class Rollout:
    """Publishes bundles and verifies them against the extender (module docstring)."""

    def __init__(
        self,
        sink: PolicySink,
        extender: ExtenderClient,
        fetcher: ModelFetcher,
        timeout_s: float = 120.0,
        poll_s: float = 1.0,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        monotonic: Callable[[], float] = time.monotonic,
    ):
        self.sink, self.extender, self.fetcher = sink, extender, fetcher
        self.timeout_s, self.poll_s, self.clock, self.sleep = timeout_s, poll_s, clock, sleep
        self.monotonic = monotonic
        """Measures the verification's ``rolloutTimeoutS``. ``clock`` (the wall clock) only dates the
        publication, which :func:`load_failed` compares with the extender's ``errorAt``."""

    async def build(
        self, namespace: str, name: str, generation: int | None, spec: PolicySpec, *, uid: str | None = None
    ) -> Bundle:
        """The bundle for a spec; raises :class:`SourceError`. ``uid``: the policy object's, kept in
        the bundle's metadata (a rollback names it next to ``rollbackOf``: a policy deleted and created
        again under the same name starts at generation 1 again)."""
        meta: dict[str, Any] = {
            "policy": f"{namespace}/{name}",
            "generation": generation,
            **({"uid": uid} if uid else {}),
            "source": spec.model.describe() if spec.model else None,
            "extenderWeight": spec.extender_weight,
        }
        data = await self.fetcher.fetch(namespace, spec)
        if data is not None:
            digest = sha256(data)
            if spec.model and spec.model.sha256 and spec.model.sha256 != digest:
                raise SourceError(
                    "DigestMismatch",
                    f"the model from {spec.model.describe()} has sha256 {digest}, "
                    f"spec.model.sha256 says {spec.model.sha256}: fix one of them",
                    False,
                )
            model_name = f"model-{digest[:16]}.npz"
            meta["digest"] = digest
            return Bundle(spec.extender_settings(self.sink.model_path(model_name)), model_name, data, meta)
        if spec.model and spec.model.path:
            meta["digest"] = spec.model.sha256
            return Bundle(spec.extender_settings(spec.model.path), None, None, meta)
        return Bundle(spec.extender_settings(None), None, None, meta)

    async def published_for(self, namespace: str, name: str, generation: int | None, spec: PolicySpec) -> Bundle | None:
        """The bundle in the current slot when it was published for this very spec (same policy,
        generation, model source and sha256, same settings), else None — read without fetching the
        model again: on an operator restart, a model source that is gone or changed (an expired
        URL, a deleted ConfigMap, new bytes under the same key) must not change what is served."""
        try:
            current = await self.sink.read(CURRENT)
        except SinkError:
            return None
        if current is None:
            return None
        meta = current.meta
        if (
            meta.get("policy") != f"{namespace}/{name}"
            or meta.get("generation") != generation
            or meta.get("source") != (spec.model.describe() if spec.model else None)
            or meta.get("extenderWeight") != spec.extender_weight
            or (spec.model is not None and spec.model.sha256 and meta.get("digest") != spec.model.sha256)
        ):
            return None
        if spec.model is not None and not spec.model.path:
            # A fetched model is published with the bundle: only a slot that holds its very bytes is
            # that bundle (it may be published again as it is, never fetched again).
            data = current.model
            if not current.model_name or data is None or meta.get("digest") != sha256(data):
                return None
            if current.settings.get("modelPath") != self.sink.model_path(current.model_name):
                return None  # the policy file of another bundle: a write stopped between the two
        model_path = current.settings.get("modelPath") if spec.model else None
        return current if spec.extender_settings(model_path) == current.settings else None

    async def publish(self, bundle: Bundle) -> float:
        """Write ``bundle`` to the current slot; returns the time it was published (the wall clock:
        it is compared with the extender's ``errorAt``)."""
        published = self.clock()
        await self.sink.write(CURRENT, bundle)
        return published

    async def error_now(self) -> ErrorSeen | None:
        """The extender's last load error as ``/status`` shows it now (taken before a publication: what
        :func:`load_failed` must not take for the publication's verdict); None when it does not answer."""
        try:
            view = await self.extender.status()
        except ExtenderUnavailable:
            return None
        return (view.error, view.error_path, view.error_at)

    async def verify(
        self, bundle: Bundle, since: float, timeout_s: float | None = None, before: ErrorSeen | None = None
    ) -> Verification:
        """Poll ``/status`` until the extender serves ``bundle``, fails it, or the time is up (on
        :attr:`monotonic`). ``since``: the publication, on the wall clock (:meth:`publish`); ``before``:
        the load error shown just before it (:meth:`error_now`)."""
        deadline = self.monotonic() + (self.timeout_s if timeout_s is None else timeout_s)
        view: ExtenderView | None = None
        last_error = ""
        while True:
            try:
                answer = await self.extender.status()
            except ExtenderUnavailable as exc:
                last_error = str(exc)
            else:
                view, last_error = answer, ""
                # Other bytes at our path are "not yet", not a failure: a ``path`` model and its
                # sha256 change together, and the extender reads the file on its own timer.
                if serves(view, bundle):
                    return Verification(None, view)
                if load_failed(view, bundle, since, before):
                    cause = Cause.DIGEST_REFUSED if refused_for_digest(view, bundle) else Cause.LOAD_ERROR
                    return Verification(cause, view, f"the extender could not load the model: {view.error}")
            if self.monotonic() >= deadline:
                break
            await self.sleep(self.poll_s)
        if view is None:
            return Verification(Cause.UNREACHABLE, None, f"the extender's status port did not answer: {last_error}")
        if last_error:
            # It answered (not serving the bundle yet) and then stopped answering: a restart, say. What
            # it serves now is unknown, so neither the timeout nor an answer from before says the
            # bundle failed: it stays published, like with an extender that never answered.
            return Verification(Cause.UNREACHABLE, view, f"the extender's status port stopped answering: {last_error}")
        if view.policy_file_error:
            return Verification(
                Cause.POLICY_FILE_REJECTED, view, f"the extender rejected the policy file: {view.policy_file_error}"
            )
        if serves(view, bundle, check_digest=False):
            return Verification(
                Cause.DIGEST_REFUSED,
                view,
                f"the extender loaded a file with sha256 {view.file_digest}, expected {bundle.digest}",
            )
        return Verification(
            Cause.TIMEOUT,
            view,
            f"the extender did not report the new bundle within {self.timeout_s:.0f}s "
            f"(it serves mode={view.mode} fallback={view.fallback} model={view.model_path}); "
            "is it reading the published files (policyFile, the ConfigMap volume)?",
        )

    async def apply(self, bundle: Bundle, *, lost_before: int = 0) -> RolloutResult:
        """Publish, verify, keep as last good or roll back (module docstring). Raises SinkError.

        ``lost_before``: the tries of this generation right before this one that ended with the
        extender lost after the bundle was published (:attr:`RolloutResult.lost_tries` of the last
        one; 0 on a first try). An extender that does not answer in this try continues such a run (it
        has not answered since it stopped); with none before, it was down before the publication and
        the bundle is not suspect."""
        before = await self.error_now()
        since = await self.publish(bundle)
        checked = await self.verify(bundle, since, before=before)
        view, message = checked.view, checked.message
        if checked.cause is None:
            if view is not None and view.model_loaded:
                bundle = dataclasses.replace(bundle, meta=dict(bundle.meta, version=view.version))
            await self.sink.write(LAST_GOOD, bundle)
            return RolloutResult(True, "RolledOut", f"the extender serves {bundle_label(bundle)}", bundle, view)
        cause = checked.cause
        if cause is Cause.UNREACHABLE:
            lost = lost_before + 1 if checked.lost or lost_before > 0 else 0
            if lost < LOST_AFTER_PUBLISH_TRIES:
                text = message + "; the bundle stays published"
                if lost:
                    text += (
                        f" (the extender stopped answering after it was published: try {lost} of "
                        f"{LOST_AFTER_PUBLISH_TRIES} before it is rolled back)"
                    )
                return RolloutResult(False, cause.value, text, bundle, view, lost_tries=lost)
            cause = Cause.LOST_AFTER_PUBLISH
            message = (
                f"the extender stopped answering after {bundle_label(bundle)} was published, on {lost} tries "
                f"(a model that crashes it while loading?): {message}"
            )
        # A last-good slot that cannot be read now (an API hiccup) is not an empty one: raising
        # SinkError retries the whole rollout (kopf's TemporaryError). Rolling back to no model
        # instead dropped the model the extender served, and overwrote the last-good slot for good.
        last_good = await self.sink.read(LAST_GOOD)
        if last_good is not None:
            last_good = dataclasses.replace(last_good, settings=_pinned(last_good))
        if last_good is not None and last_good.same_content(bundle):
            last_good = None  # the failed bundle itself: no earlier good one
        # ``rollbackOf`` marks the current slot as the rollback from this generation when its model is
        # what failed (:attr:`Cause.model_failed`): an operator restart (resume, or the create/update
        # kopf runs again when this one did not finish) then leaves the known-bad generation alone
        # instead of publishing it again; ``rollbackUid`` tells the object from one created again
        # under the same name, ``rollbackReason`` says why (the status a run again reports).
        mark = (
            {
                "rollbackOf": bundle.meta.get("generation"),
                "rollbackUid": bundle.meta.get("uid"),
                "rollbackReason": cause.value,
            }
            if cause.model_failed
            else {}
        )
        if last_good is None:
            # No earlier good bundle: the same settings without the model — the fallback serves. Its
            # modelSha256 is null, not left out: the extender's own base digest must not apply.
            meta = dict(
                bundle.meta,
                digest=None,
                source=None,
                generation=None,
                rollbackOf=None,
                rollbackUid=None,
                rollbackReason=None,
            )
            target = Bundle(dict(bundle.settings, modelPath=None, modelSha256=None), None, None, dict(meta, **mark))
        else:
            target = dataclasses.replace(last_good, meta=dict(last_good.meta, **mark))
        before = await self.error_now()
        since = await self.publish(target)
        back = await self.verify(target, since, before=before)
        if back.ok and last_good is not None:
            await self.sink.write(LAST_GOOD, last_good)  # it only ever holds a bundle that rolled out
        text = f"{message}; rolled back to {bundle_label(target)}"
        if not back.ok:
            text += f", but the rollback is not confirmed either: {back.message}"
        return RolloutResult(False, cause.value, text, bundle, back.view or view, target, back.ok)

    async def revert(self) -> None:
        """The served policy is gone: publish an empty policy file (the extender's own settings)."""
        await self.sink.write(CURRENT, Bundle({}, None, None, {"policy": None}))
        try:
            await self.sink.clear(LAST_GOOD)
        except Exception as exc:  # noqa: BLE001 - best effort
            log.warning("could not clear the last-good slot: %s", exc)


__all__ = [
    "LOST_AFTER_PUBLISH_TRIES",
    "Cause",
    "MetadataAddressRefused",
    "ModelFetcher",
    "ModelTooLarge",
    "Rollout",
    "RolloutResult",
    "SinkError",
    "SourceError",
    "Verification",
    "bundle_label",
    "metadata_address",
    "serves",
]
