"""Client of the extender's read-only listener: ``GET /status`` and ``GET /decisions?after=N``.

The formats are the extender's (``rlsched.extender.app.make_status_app``): ``/status`` carries the
policy engine's view under ``policy`` (mode, fallback, model path/version/digest/error, counters);
``/decisions`` answers ``{epoch, next, last, dropped, reset, records}``.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import aiohttp


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
    def from_status(cls, body: Any) -> "ExtenderView":
        if not isinstance(body, dict) or not isinstance(body.get("policy"), dict):
            raise ExtenderUnavailable("GET /status: no 'policy' object in the answer (is this the extender's status port?)")
        p = body["policy"]
        m = p.get("model") or {}
        return cls(
            mode=p.get("mode"), fallback=p.get("fallback"), deadline_ms=p.get("deadlineMs"), top_k=p.get("topK"),
            policy_file_error=p.get("policyFileError"), model_path=m.get("path"), model_loaded=bool(m.get("loaded")),
            version=m.get("version"), digest=m.get("digest"), file_digest=m.get("fileDigest"),
            loaded_at=m.get("loadedAt"), error=m.get("error"), error_at=m.get("errorAt"), error_path=m.get("errorPath"),
            counters={k: int(v) for k, v in (p.get("counters") or {}).items() if isinstance(v, (int, float))},
        )


class ExtenderClient:
    """One aiohttp session to the status port."""

    def __init__(self, base_url: str, timeout_s: float = 5.0):
        self.base_url = base_url.rstrip("/")
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session: aiohttp.ClientSession | None = None

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=self.timeout)
        return self._session

    async def _get(self, path: str, params: dict[str, str] | None = None) -> Any:
        url = f"{self.base_url}{path}"
        try:
            async with self._get_session().get(url, params=params) as resp:
                if resp.status != 200:
                    text = (await resp.text())[:300]
                    raise ExtenderUnavailable(f"GET {url}: HTTP {resp.status}: {text}")
                return await resp.json(content_type=None)
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
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
