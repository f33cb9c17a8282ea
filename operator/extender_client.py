"""Client of the extender's read-only listener: ``GET /status`` and ``GET /decisions?after=N``.

The formats are the extender's (``rlsched.extender.app.make_status_app``): ``/status`` carries the
policy engine's view under ``policy`` (mode, fallback, model path/version/digest/error, counters);
``/decisions`` answers ``{epoch, next, last, dropped, reset, records}``.

Both need ``Authorization: Bearer <token>`` when the extender runs with ``auth.mode: kubernetes`` (its
default): the operator sends its ServiceAccount token (:class:`TokenFile`), read again whenever the
file changes — the kubelet rotates projected tokens — and never logged.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Any

import aiohttp

log = logging.getLogger("rlsched.operator.extender")

MAX_TOKEN_FILE_BYTES = 65536
"""A token file larger than this is not a token (and is not read whole)."""


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
    counters: dict[str, int] = field(default_factory=dict)

    @classmethod
    def from_status(cls, body: Any) -> ExtenderView:
        if not isinstance(body, dict) or not isinstance(body.get("policy"), dict):
            raise ExtenderUnavailable(
                "GET /status: no 'policy' object in the answer (is this the extender's status port?)"
            )
        p = body["policy"]
        m = p.get("model") or {}
        return cls(
            mode=p.get("mode"),
            fallback=p.get("fallback"),
            deadline_ms=p.get("deadlineMs"),
            top_k=p.get("topK"),
            policy_file_error=p.get("policyFileError"),
            model_path=m.get("path"),
            model_loaded=bool(m.get("loaded")),
            version=m.get("version"),
            digest=m.get("digest"),
            file_digest=m.get("fileDigest"),
            loaded_at=m.get("loadedAt"),
            error=m.get("error"),
            error_at=m.get("errorAt"),
            error_path=m.get("errorPath"),
            counters={k: int(v) for k, v in (p.get("counters") or {}).items() if isinstance(v, (int, float))},
        )


class ExtenderClient:
    """One aiohttp session to the status port."""

    def __init__(self, base_url: str, timeout_s: float = 5.0, token_file: str | None = None):
        from .settings import IN_CLUSTER_TOKEN

        self.base_url = base_url.rstrip("/")
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session: aiohttp.ClientSession | None = None
        self.token = TokenFile(token_file, quiet_if_missing=token_file == IN_CLUSTER_TOKEN)

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=self.timeout)
        return self._session

    async def _get(self, path: str, params: dict[str, str] | None = None) -> Any:
        url = f"{self.base_url}{path}"
        token = self.token.token()
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        try:
            async with self._get_session().get(url, params=params, headers=headers) as resp:
                if resp.status != 200:
                    text = (await resp.text())[:300]
                    hint = ""
                    if resp.status == 401:
                        hint = (
                            f" (no token sent: extender.tokenFile {self.token.path or 'unset'} is missing)"
                            if not token
                            else " (the extender's API server did not accept extender.tokenFile's token)"
                        )
                    elif resp.status == 403:
                        hint = f" (the operator's identity needs get on the non-resource URL {path})"
                    raise ExtenderUnavailable(f"GET {url}: HTTP {resp.status}: {text}{hint}")
                return await resp.json(content_type=None)
        except (TimeoutError, aiohttp.ClientError, ValueError) as exc:
            raise ExtenderUnavailable(f"GET {url}: {type(exc).__name__}: {exc}") from None

    async def status(self) -> ExtenderView:
        return ExtenderView.from_status(await self._get("/status"))

    async def decisions(self, after: int, limit: int = 1000) -> dict[str, Any]:
        body = await self._get("/decisions", {"after": str(after), "limit": str(limit)})
        if not isinstance(body, dict) or not isinstance(body.get("records"), list):
            raise ExtenderUnavailable("GET /decisions: no 'records' list in the answer")
        return body

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
