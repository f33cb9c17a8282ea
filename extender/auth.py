"""Who may read the status listener: bearer tokens checked by the API server.

The convention of kube-rbac-proxy and controller-runtime's metrics filter, so a cluster's RBAC says
who may read what: a caller sends ``Authorization: Bearer <token>``; a **TokenReview**
(authentication.k8s.io/v1) says whose token it is, then a **SubjectAccessReview**
(authorization.k8s.io/v1) whether that user may ``get`` the non-resource URL asked for
(``/status``, ``/decisions``, ``/metrics``). A ClusterRole with ``nonResourceURLs: ["/decisions"]``,
``verbs: [get]`` grants it. Answers: 401 (with ``WWW-Authenticate: Bearer``) without a token or with
one the API server does not accept, 403 when the review denies, 503 when the API server cannot be
asked (never 500: it is not the caller's fault, and the next try may work).

Why the shape:

- answers are cached per (token digest, path) in a bounded LRU with a TTL, refusals for a shorter
  TTL, so a scrape every few seconds costs no API call and a caller repeating a bad token cannot
  turn each request into two API calls. Tokens are kept only as SHA-256 digests and never logged;
- identical checks in flight share one review, and at most :data:`MAX_CONCURRENT_REVIEWS` run at
  once: a burst of requests with fresh tokens cannot open unbounded API calls;
- a token longer than :data:`MAX_TOKEN_BYTES` or with characters no token has is refused without
  asking anyone.

Audiences (``auth.audiences``; kube-rbac-proxy's ``--auth-token-audiences``): the listener speaks plain
HTTP, so a token sent to it can be read off the pod network. A pod's ordinary ServiceAccount token is
valid against the API server, with all its owner's rights (the operator's may patch pods); a token
made for the audience ``rlsched-extender`` is refused there, so a stolen one reads ``/status`` and
nothing more. The TokenReview therefore asks for the configured audiences first (``spec.audiences``)
and accepts the token only when ``status.audiences`` names one of them; then, with
``auth.apiServerAudience`` (Prometheus scrapes with its default token), a second review without
audiences asks whether the API server itself would take it (a review that authenticates the token
but names no audience, from an authenticator blind to them, means the same by the API's contract). The
answer, either way, is one cache entry per token digest: a refused token costs at most those two
reviews per negative TTL.

The extender's own identity needs ``create`` on tokenreviews and subjectaccessreviews (the built-in
ClusterRole ``system:auth-delegator``).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from aiohttp import web
from prometheus_client import Counter

from .kubeapi import ApiError
from .log_throttle import EveryFewSeconds
from .settings import AuthSettings
from .wire import error_body

log = logging.getLogger("rlsched.extender.auth")

TOKENREVIEWS_PATH = "/apis/authentication.k8s.io/v1/tokenreviews"
SUBJECTACCESSREVIEWS_PATH = "/apis/authorization.k8s.io/v1/subjectaccessreviews"

MAX_TOKEN_BYTES = 8192
"""Longest bearer token considered (ServiceAccount tokens are ~1 KB; OIDC ID tokens a few KB)."""
CACHE_ENTRIES = 4096
"""Most (token, path) answers and token identities kept; the least recently used go first."""
MAX_CONCURRENT_REVIEWS = 16
"""Reviews in flight at once; further checks wait (up to the review timeout, then 503)."""

_TOKEN = re.compile(r"[\x21-\x7e]+")
"""Visible ASCII: the bytes a JWT or any opaque bearer token is made of (RFC 6750's b64token and more)."""
_BEARER = re.compile(r"[Bb][Ee][Aa][Rr][Ee][Rr] +")


class ReviewApi(Protocol):
    """The one call the authenticator makes (``rlsched.extender.kubeapi.KubeApi.request``)."""

    async def request(
        self, method: str, path: str, body: Any = None, content_type: str = "application/json", timeout: float = 10.0
    ) -> Any: ...


@dataclass(frozen=True)
class User:
    """Who a TokenReview says the token belongs to (the SubjectAccessReview repeats it)."""

    name: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: tuple[tuple[str, tuple[str, ...]], ...] = ()


@dataclass(frozen=True)
class Verdict:
    """The answer for one request: ``status`` 200 (go on), 401, 403 or 503, and why."""

    status: int
    reason: str
    user: str | None = None

    @property
    def allowed(self) -> bool:
        return self.status == 200


K = TypeVar("K", bound=Hashable)
V = TypeVar("V")
T = TypeVar("T")


class TtlCache(Generic[K, V]):
    """A bounded LRU whose entries expire, each after its own TTL."""

    def __init__(self, max_entries: int, clock: Callable[[], float] = time.monotonic):
        self.max_entries, self.clock = max_entries, clock
        self._items: OrderedDict[K, tuple[float, V]] = OrderedDict()

    def get(self, key: K) -> V | None:
        item = self._items.get(key)
        if item is None:
            return None
        expires, value = item
        if self.clock() >= expires:
            del self._items[key]
            return None
        self._items.move_to_end(key)
        return value

    def put(self, key: K, value: V, ttl_s: float) -> None:
        if ttl_s <= 0:
            return
        self._items[key] = (self.clock() + ttl_s, value)
        self._items.move_to_end(key)
        while len(self._items) > self.max_entries:
            self._items.popitem(last=False)

    def __len__(self) -> int:
        return len(self._items)


class _Unavailable(Exception):
    """The API server could not answer a review (not the caller's fault: HTTP 503)."""


class Authenticator:
    """Checks ``Authorization`` headers with TokenReview + SubjectAccessReview, with caching."""

    def __init__(
        self, api: ReviewApi, settings: AuthSettings, registry: Any = None, clock: Callable[[], float] = time.monotonic
    ):
        self.api, self.settings = api, settings
        self._verdicts: TtlCache[tuple[bytes, str, str], Verdict] = TtlCache(CACHE_ENTRIES, clock)
        self._users: TtlCache[bytes, User | str] = TtlCache(CACHE_ENTRIES, clock)
        """token digest → the user, or the reason the token was refused."""
        self._inflight: dict[tuple[bytes, str, str], asyncio.Task[Verdict]] = {}
        """Reviews in flight, shared by identical checks."""
        self._slots = asyncio.Semaphore(MAX_CONCURRENT_REVIEWS)
        self._quiet = EveryFewSeconds()
        self.results = Counter(
            "rlsched_extender_auth_requests_total",
            "Requests to protected status endpoints by result: allowed, unauthenticated (401), "
            "forbidden (403), unavailable (503: the API server could not be asked)",
            ["result"],
            registry=registry,
        )
        self.reviews = Counter(
            "rlsched_extender_auth_reviews_total",
            "TokenReview (kind=token) and SubjectAccessReview (kind=access) calls by result "
            "(ok, error); answers served from the cache make none",
            ["kind", "result"],
            registry=registry,
        )
        for result in ("allowed", "unauthenticated", "forbidden", "unavailable"):
            self.results.labels(result)

    async def check(self, authorization: str | None, path: str, verb: str = "get") -> Verdict:
        """The verdict for a request to ``path`` carrying this ``Authorization`` header."""
        verdict = await self._check(authorization, path, verb)
        self.results.labels(
            {200: "allowed", 401: "unauthenticated", 403: "forbidden"}.get(verdict.status, "unavailable")
        ).inc()
        return verdict

    async def _check(self, authorization: str | None, path: str, verb: str) -> Verdict:
        token = bearer_token(authorization)
        if isinstance(token, Verdict):
            return token
        key = (hashlib.sha256(token.encode()).digest(), path, verb)
        cached = self._verdicts.get(key)
        if cached is not None:
            return cached
        task = self._inflight.get(key)
        if task is None:
            # A task of its own: a caller that goes away (its handler cancelled) does not cancel the
            # review the others wait for.
            task = asyncio.ensure_future(self._review(token, key[0], path, verb))
            self._inflight[key] = task
            task.add_done_callback(lambda _: self._inflight.pop(key, None))
        return await asyncio.shield(task)

    async def _review(self, token: str, digest: bytes, path: str, verb: str) -> Verdict:
        timeout = self.settings.review_timeout_s
        try:
            try:
                await asyncio.wait_for(self._slots.acquire(), timeout)
            except TimeoutError:
                raise _Unavailable(f"{MAX_CONCURRENT_REVIEWS} reviews already in flight for {timeout:g} s") from None
            try:
                user = self._users.get(digest)
                if user is None:
                    user = await self._token_review(token)
                    self._users.put(
                        digest,
                        user,
                        self.settings.cache_ttl_s if isinstance(user, User) else self.settings.negative_cache_ttl_s,
                    )
                if isinstance(user, str):
                    verdict = Verdict(401, f"the bearer token was not accepted: {user}")
                else:
                    allowed, why = await self._access_review(user, path, verb)
                    verdict = (
                        Verdict(200, "", user.name)
                        if allowed
                        else Verdict(
                            403,
                            f"user {user.name!r} may not {verb} {path}"
                            + (f": {why}" if why else "")
                            + f' (grant a ClusterRole with nonResourceURLs ["{path}"], verbs [{verb}])',
                            user.name,
                        )
                    )
            finally:
                self._slots.release()
        except _Unavailable as exc:
            if (skipped := self._quiet("unavailable")) is not None:
                log.warning(
                    "cannot check a token for %s: %s%s",
                    path,
                    exc,
                    f" ({skipped} more since the last line)" if skipped else "",
                    extra={"event": "auth_unavailable", "path": path},
                )
            return Verdict(503, f"cannot check the token now: {exc}")
        self._verdicts.put(
            (digest, path, verb),
            verdict,
            self.settings.cache_ttl_s if verdict.allowed else self.settings.negative_cache_ttl_s,
        )
        if not verdict.allowed and (skipped := self._quiet(f"refused-{verdict.status}")) is not None:
            log.info(
                "refused %s %s → %d: %s%s",
                verb,
                path,
                verdict.status,
                verdict.reason,
                f" ({skipped} more refusals since the last line)" if skipped else "",
                extra={"event": "auth_refused", "path": path, "status": verdict.status, "user": verdict.user},
            )
        return verdict

    async def _call(self, kind: str, path: str, body: dict[str, Any], read: Callable[[dict[str, Any]], T]) -> T:
        """POST a review and ``read`` its status; an answer that cannot be had or read (``read`` raises
        ValueError for one of the wrong shape) is counted as an error and raised as _Unavailable."""
        what = "TokenReview" if kind == "token" else "SubjectAccessReview"
        try:
            answer = await self.api.request("POST", path, body, timeout=self.settings.review_timeout_s)
        except (TimeoutError, ApiError, ValueError, OSError) as exc:  # ValueError: an answer that is not JSON
            self.reviews.labels(kind, "error").inc()
            hint = (
                " — the extender's identity needs create on tokenreviews and subjectaccessreviews "
                "(ClusterRole system:auth-delegator)"
                if getattr(exc, "status", None) == 403
                else ""
            )
            raise _Unavailable(f"{what}: {str(exc)[:300] or type(exc).__name__}{hint}") from None
        status = answer.get("status") if isinstance(answer, dict) else None
        try:
            if not isinstance(status, dict):
                raise ValueError("the API server's answer has no status")
            result = read(status)
        except ValueError as exc:
            self.reviews.labels(kind, "error").inc()
            raise _Unavailable(f"{what}: {exc}") from None
        self.reviews.labels(kind, "ok").inc()
        return result

    async def _token_review(self, token: str) -> User | str:
        """Whose token it is, or why it is refused: a review for ``auth.audiences`` (when any), then,
        with ``auth.apiServerAudience`` and that one refused, a review for the API server's own."""
        wanted = self.settings.audiences
        refusals = []
        if wanted:
            user, audiences = await self._call(
                "token", TOKENREVIEWS_PATH, _token_review_body(token, wanted), _audience_answer
            )
            if isinstance(user, User):
                if set(audiences) & set(wanted):
                    return user
                if not audiences:
                    # An authenticator that ignores audiences: by the TokenReview API's contract the
                    # token is then valid for the API server's audience, and a second review would say
                    # the same.
                    if self.settings.api_server_audience:
                        return user
                    return "a token for the API server's audience (auth.apiServerAudience is false)"
                refusals.append(f"for audiences {list(wanted)}: the review names only {list(audiences)}"[:300])
            else:
                refusals.append(f"for audiences {list(wanted)}: {user}")
        if self.settings.api_server_audience:
            user = await self._call("token", TOKENREVIEWS_PATH, _token_review_body(token, ()), _token_user)
            if isinstance(user, User):
                return user
            refusals.append(f"for the API server: {user}" if wanted else user)
        return "; ".join(refusals) or "no token audience is accepted"

    async def _access_review(self, user: User, path: str, verb: str) -> tuple[bool, str]:
        spec: dict[str, Any] = {
            "user": user.name,
            "groups": list(user.groups),
            "nonResourceAttributes": {"path": path, "verb": verb},
        }
        if user.uid:
            spec["uid"] = user.uid
        if user.extra:
            spec["extra"] = {k: list(v) for k, v in user.extra}
        return await self._call(
            "access",
            SUBJECTACCESSREVIEWS_PATH,
            {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec},
            lambda status: (status.get("allowed") is True, str(status.get("reason") or "")[:300]),
        )


def _token_review_body(token: str, audiences: tuple[str, ...]) -> dict[str, Any]:
    """A TokenReview of ``token``; with ``audiences``, asking whether it was made for one of them
    (none: for the API server's own)."""
    spec: dict[str, Any] = {"token": token}
    if audiences:
        spec["audiences"] = list(audiences)
    return {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": spec}


def _audience_answer(status: dict[str, Any]) -> tuple[User | str, tuple[str, ...]]:
    """:func:`_token_user` and, for an authenticated token, ``status.audiences``: those of the audiences
    asked that the token was made for (none: the authenticator ignores audiences)."""
    user = _token_user(status)
    if not isinstance(user, User):
        return user, ()
    audiences = status.get("audiences")
    if audiences is not None and not _strings(audiences):
        raise ValueError("status.audiences is not a list of strings")
    return user, tuple(audiences or ())


def _token_user(status: dict[str, Any]) -> User | str:
    """Whose token a TokenReview's status says it is, or why the token was refused. An answer of the
    wrong shape is the API server's (or an authentication webhook's) fault, not the caller's: ValueError,
    never a guess at what was meant (a dropped group or extra value changes what the user may do)."""
    if status.get("authenticated") is not True:
        return str(status.get("error") or "unknown or expired token")[:300]
    u = status.get("user")
    if not isinstance(u, dict) or not isinstance(u.get("username"), str) or not u["username"]:
        return "the TokenReview names no user"
    uid, groups, extra = u.get("uid"), u.get("groups"), u.get("extra")
    if uid is not None and not isinstance(uid, str):
        raise ValueError("user.uid is not a string")
    if groups is not None and not _strings(groups):
        raise ValueError("user.groups is not a list of strings")
    # Go encodes a nil ExtraValue as null.
    if extra is not None and not (isinstance(extra, dict) and all(v is None or _strings(v) for v in extra.values())):
        raise ValueError("user.extra is not an object of string lists")
    return User(
        u["username"],
        uid or "",
        tuple(groups or ()),
        tuple(sorted((k, tuple(v or ())) for k, v in (extra or {}).items())),
    )


def _strings(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(x, str) for x in value)


def bearer_token(authorization: str | None) -> str | Verdict:
    """The token of an ``Authorization: Bearer <token>`` header, or the 401 verdict saying what is wrong
    (the message never repeats the header)."""
    if not authorization:
        return Verdict(401, "authentication required: send Authorization: Bearer <token> (a ServiceAccount token)")
    m = _BEARER.match(authorization)
    if m is None:
        return Verdict(401, "the Authorization header must use the Bearer scheme")
    token = authorization[m.end() :].strip(" ")
    if not token:
        return Verdict(401, "the Authorization header carries an empty bearer token")
    if len(token) > MAX_TOKEN_BYTES:
        return Verdict(401, f"the bearer token is longer than {MAX_TOKEN_BYTES} bytes")
    if _TOKEN.fullmatch(token) is None:
        return Verdict(401, "the bearer token has characters no token has (visible ASCII only)")
    return token


def refusal(verdict: Verdict) -> web.Response:
    """The HTTP answer for a verdict that is not 200 (JSON ``{"Error": ...}`` like every other error)."""
    headers = {}
    if verdict.status == 401:
        headers["WWW-Authenticate"] = 'Bearer realm="rlsched-extender"'
    elif verdict.status == 503:
        headers["Retry-After"] = "5"
    return web.Response(
        status=verdict.status, body=error_body(verdict.reason), content_type="application/json", headers=headers
    )


def auth_middleware(auth: Authenticator, protected: frozenset[str]) -> Callable[..., Awaitable[web.StreamResponse]]:
    """Check every request whose route is one of ``protected`` (matched on the route, not the raw path,
    so ``/%73tatus`` is ``/status`` here as in the router); others pass untouched."""

    @web.middleware
    async def middleware(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        resource = request.match_info.route.resource
        path = resource.canonical if resource is not None else None
        if path not in protected:
            return await handler(request)
        verdict = await auth.check(request.headers.get("Authorization"), path)
        if not verdict.allowed:
            return refusal(verdict)
        return await handler(request)

    return middleware
