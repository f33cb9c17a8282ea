"""Reading an HTTP answer no further than a cap.

Every answer the extender and the operator read from elsewhere (Prometheus, the extender's status
port, a model URL) is read through here: an answer far larger than what is asked for is a broken or
hostile peer, and decoding it would cost memory and hold the event loop."""

from __future__ import annotations

import aiohttp

READ_CHUNK = 1 << 16


class AnswerTooLong(Exception):
    """An answer over its cap (the message says how large and which cap)."""


async def read_at_most(resp: aiohttp.ClientResponse, max_bytes: int) -> tuple[bytes, bool]:
    """The answer's first ``max_bytes`` bytes, and whether it is longer (the rest is not read: the
    connection is closed instead of reused). For the head of an error text, say."""
    data = bytearray()
    async for chunk in resp.content.iter_chunked(READ_CHUNK):
        data += chunk
        if len(data) > max_bytes:
            return bytes(data[:max_bytes]), True
    return bytes(data), False


async def read_capped(resp: aiohttp.ClientResponse, max_bytes: int) -> bytes:
    """The whole answer, or :class:`AnswerTooLong` when it is longer than ``max_bytes``: refused unread
    when its Content-Length says so, else read no further than the cap."""
    if resp.content_length is not None and resp.content_length > max_bytes:
        raise AnswerTooLong(f"the answer has {resp.content_length:,} bytes, over the cap of {max_bytes:,}")
    data, longer = await read_at_most(resp, max_bytes)
    if longer:
        raise AnswerTooLong(f"the answer is longer than the cap of {max_bytes:,} bytes")
    return data
