"""Client of the extender's read-only listener: ``GET /status`` and ``GET /decisions?after=N``.

The formats are the extender's (``rlsched.extender.app.make_status_app``): ``/status`` carries the
policy engine's view under ``policy`` (mode, fallback, model path/version/digest/error, counters);
``/decisions`` answers ``{epoch, next, last, dropped, reset, records}``.

Both need ``Authorization: Bearer <token>`` when the extender runs with ``auth.mode: kubernetes`` (its
default): the operator sends its ServiceAccount token (:class:`TokenFile`), read again whenever the
file changes — the kubelet rotates projected tokens — and never logged.

With an ``https://`` status URL (the extender's ``server.statusTls``) the extender's certificate is
verified against ``extender.caFile`` (:class:`CaBundle`, read again when it changes), or the system's
trust store, and must name the URL's host; a certificate that does not verify is
:class:`ExtenderUnavailable` like an extender that does not answer, with a message that says which
file to look at: callers retry it.

Answers are untrusted input (a wrong URL, another service, an extender of another version): each is
read up to a byte cap (:data:`STATUS_MAX_BYTES`, :data:`DECISION_RECORD_BYTES`), and
:meth:`ExtenderView.from_status` keeps only fields of the expected type, so the rollout compares
well-typed values; anything unreadable is :class:`ExtenderUnavailable`, the one error callers handle.
"""

from __future__ import annotations

import json
import logging
import math
import os
import ssl
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from rlsched.extender.bounded_read import AnswerTooLong, read_at_most, read_capped

log = logging.getLogger("rlsched.operator.extender")

MAX_TOKEN_FILE_BYTES = 65536
"""A token file larger than this is not a token (and is not read whole)."""

STATUS_MAX_BYTES = 1024 * 1024
"""Most bytes read of a ``/status`` answer: the extender's is ~1 KB (a 50-node cluster, measured), its
longest parts error texts; a thousand times that bounds what a wrong or hostile listener makes the
operator buffer and parse (a 100 MiB answer cost ~200 MiB of memory when read whole)."""

DECISION_RECORD_BYTES = 16 * 1024
"""Byte budget per record asked for from ``/decisions`` (an answer may hold ``limit`` times this; the
operator asks for ``decisionLog.drainLimit``, 1000 by default: 16 MiB): a filter record is ~1.2 KB with
topK 1 (measured: 40-character pod and node names) and each kept node adds its name, so a topK of ~300
fits. A larger page (records keeping many more nodes) is asked for again with half as many records,
under the same cap."""

ERROR_TEXT_BYTES = 1024
"""Most bytes read of a non-200 answer (the message quotes its first 300 characters)."""

_INT64_MAX = 2**63 - 1
"""Counters beyond this do not fit the policy's status (an int64 in the API server)."""


class TokenFile:
    """A bearer token from a file, re-read when the file changes (a ``stat`` per request: cheap).

    A missing or unreadable file yields no token; the problem is logged once per kind of problem (the
    extender's 401 then says what is missing), and the default in-cluster path is quiet when absent."""

    def __init__(self, path: str | None, quiet_if_missing: bool = False):
        self.path, self.quiet_if_missing = path, quiet_if_missing
        self._stamp: tuple[int, int, int] | None = None
        self._token: str | None = None
        self._reported: str | None = None

    def token(self) -> str | None:
        if not self.path:
            return None
        try:
            st = os.stat(self.path)
            stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
            if stamp != self._stamp:
                with open(self.path, "rb") as f:
                    raw = f.read(MAX_TOKEN_FILE_BYTES + 1)
                if len(raw) > MAX_TOKEN_FILE_BYTES:
                    raise ValueError(f"larger than {MAX_TOKEN_FILE_BYTES} bytes")
                token = raw.decode("ascii").strip()
                if not token:
                    raise ValueError("empty")
                self._token, self._stamp, self._reported = token, stamp, None
        except FileNotFoundError:
            self._forget("missing", quiet=self.quiet_if_missing)
        except (OSError, ValueError) as exc:  # UnicodeDecodeError is a ValueError
            self._forget(f"unreadable: {type(exc).__name__}: {exc}")
        return self._token

    def _forget(self, problem: str, quiet: bool = False) -> None:
        self._token, self._stamp = None, None
        if problem != self._reported and not quiet:
            log.warning("extender token file %s %s: requests to the extender go without a token", self.path, problem)
        self._reported = problem


class ExtenderUnavailable(Exception):
    """The status port did not answer (or answered garbage); the message says how."""


class CaBundle:
    """The SSLContext that verifies the extender's status certificate: ``extender.caFile``, or the
    system's trust store when unset. Built again when the file changes (a ``stat`` per request), so a
    CA rotated in the mounted Secret is trusted without a restart; a file that cannot be read or
    parsed is :class:`ExtenderUnavailable` (retried), naming it."""

    def __init__(self, path: str | None):
        self.path = path or None
        self._stamp: tuple[int, int, int] | None = None
        self._context: ssl.SSLContext | None = None

    def context(self) -> ssl.SSLContext:
        if self.path is None:
            if self._context is None:
                self._context = ssl.create_default_context()
            return self._context
        try:
            st = os.stat(self.path)
            stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
            if stamp != self._stamp or self._context is None:
                self._context = ssl.create_default_context(cafile=self.path)
                self._stamp = stamp
        except (OSError, ssl.SSLError) as exc:
            self._stamp = None
            raise ExtenderUnavailable(
                f"extender.caFile {self.path}: not a readable PEM CA bundle: {getattr(exc, 'strerror', None) or exc}"
            ) from None
        return self._context

    def describe(self) -> str:
        return f"extender.caFile {self.path}" if self.path else "the system's trust store (extender.caFile unset)"


class AnswerTooLarge(ExtenderUnavailable):
    """The answer is longer than the cap for its path (the rest was not read)."""


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _float(value: Any) -> float | None:
    """A finite number (JSON reads ``NaN``, ``Infinity`` and ``1e400`` as floats too)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:  # an integer of hundreds of digits
        return None
    return number if math.isfinite(number) else None


def _int(value: Any) -> int | None:
    """An integer within int64 (a float with an integral value counts)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    return value if isinstance(value, int) and abs(value) <= _INT64_MAX else None


@dataclass(frozen=True)
class ExtenderView:
    """What the extender says it serves (``/status`` → ``policy``)."""

    mode: str | None = None
    fallback: str | None = None
    deadline_ms: float | None = None
    top_k: int | None = None
    policy_file_error: str | None = None
    model_path: str | None = None
    model_loaded: bool = False
    version: str | None = None
    digest: str | None = None
    file_digest: str | None = None
    loaded_at: float | None = None
    error: str | None = None
    error_at: float | None = None
    error_path: str | None = None
    """The file the last load error is about, when the extender reports it (``model.errorPath``)."""
    error_kind: str | None = None
    """``digest`` or ``load`` (``model.errorKind``); None from an extender older than the field."""
    counters: dict[str, int] = field(default_factory=dict)

    @classmethod
    def from_status(cls, body: Any) -> ExtenderView:
        if not isinstance(body, dict) or not isinstance(body.get("policy"), dict):
            raise ExtenderUnavailable(
                "GET /status: no 'policy' object in the answer (is this the extender's status port?)"
            )
        # Every field is checked for its type: one of another type reads as absent (None, False, no counter).
        p = body["policy"]
        m = p.get("model")
        if not isinstance(m, dict):
            m = {}
        counters = p.get("counters")
        if not isinstance(counters, dict):
            counters = {}
        return cls(
            mode=_str(p.get("mode")),
            fallback=_str(p.get("fallback")),
            deadline_ms=_float(p.get("deadlineMs")),
            top_k=_int(p.get("topK")),
            policy_file_error=_str(p.get("policyFileError")),
            model_path=_str(m.get("path")),
            model_loaded=m.get("loaded") is True,
            version=_str(m.get("version")),
            digest=_str(m.get("digest")),
            file_digest=_str(m.get("fileDigest")),
            loaded_at=_float(m.get("loadedAt")),
            error=_str(m.get("error")),
            error_at=_float(m.get("errorAt")),
            error_path=_str(m.get("errorPath")),
            error_kind=_str(m.get("errorKind")),
            counters={k: n for k, v in counters.items() if (n := _int(v)) is not None and n >= 0},
        )


class ExtenderClient:
    """One aiohttp session to the status port."""

    def __init__(
        self, base_url: str, timeout_s: float = 5.0, token_file: str | None = None, ca_file: str | None = None
    ):
        from .settings import IN_CLUSTER_TOKEN

        self.base_url = base_url.rstrip("/")
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session: aiohttp.ClientSession | None = None
        self.token = TokenFile(token_file, quiet_if_missing=token_file == IN_CLUSTER_TOKEN)
        self.https = self.base_url.lower().startswith("https://")
        self.ca = CaBundle(ca_file)

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=self.timeout)
        return self._session

    async def _get(self, path: str, params: dict[str, str] | None, max_bytes: int) -> Any:
        """The JSON answer of ``GET path``, read up to ``max_bytes`` (:class:`AnswerTooLarge` beyond)."""
        url = f"{self.base_url}{path}"
        token = self.token.token()
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        tls: ssl.SSLContext | bool = self.ca.context() if self.https else True
        try:
            async with self._get_session().get(url, params=params, headers=headers, ssl=tls) as resp:
                if resp.status != 200:
                    head, _ = await read_at_most(resp, ERROR_TEXT_BYTES)
                    text = head.decode("utf-8", errors="replace")[:300]
                    hint = ""
                    if resp.status == 401:
                        hint = (
                            f" (no token sent: extender.tokenFile {self.token.path or 'unset'} is missing)"
                            if not token
                            else " (the extender did not accept extender.tokenFile's token: expired, or made for an "
                            "audience that is not in the extender's auth.audiences)"
                        )
                    elif resp.status == 403:
                        hint = f" (the operator's identity needs get on the non-resource URL {path})"
                    raise ExtenderUnavailable(f"GET {url}: HTTP {resp.status}: {text}{hint}")
                try:
                    raw = await read_capped(resp, max_bytes)
                except AnswerTooLong:
                    raise AnswerTooLarge(f"GET {url}: the answer is larger than {max_bytes:,} bytes") from None
                return json.loads(raw)
        # ValueError: not JSON (or not UTF-8); RecursionError: JSON nested thousands deep
        except (TimeoutError, aiohttp.ClientError, ValueError, RecursionError) as exc:
            raise ExtenderUnavailable(f"GET {url}: {type(exc).__name__}: {exc}{self._tls_hint(exc)}") from None

    def _tls_hint(self, exc: BaseException) -> str:
        """What to check after a TLS failure (empty for other errors)."""
        if isinstance(exc, aiohttp.ClientConnectorCertificateError):
            return (
                f" (the extender's status certificate is not signed by a CA in {self.ca.describe()}, or does not "
                "name the host of extender.statusUrl)"
            )
        if isinstance(exc, aiohttp.ClientSSLError):
            return " (is the extender's status listener serving HTTPS? its server.statusTls settings)"
        if not self.https and isinstance(exc, (aiohttp.ServerDisconnectedError, aiohttp.ClientResponseError)):
            return " (if the extender serves HTTPS, server.statusTls, extender.statusUrl must be https://)"
        return ""

    async def status(self) -> ExtenderView:
        return ExtenderView.from_status(await self._get("/status", None, STATUS_MAX_BYTES))

    async def decisions(self, after: int, limit: int = 1000) -> dict[str, Any]:
        """Records after cursor ``after``: at most ``limit``, fewer when that many do not fit the cap."""
        max_bytes = max(1, limit) * DECISION_RECORD_BYTES
        while True:
            try:
                body = await self._get("/decisions", {"after": str(after), "limit": str(limit)}, max_bytes)
                break
            except AnswerTooLarge:
                if limit <= 1:
                    raise
                limit //= 2
                log.debug("GET /decisions: the page is larger than %d bytes; asking for %d records", max_bytes, limit)
        if not isinstance(body, dict) or not isinstance(body.get("records"), list):
            raise ExtenderUnavailable("GET /decisions: no 'records' list in the answer")
        return body

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
