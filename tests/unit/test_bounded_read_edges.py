"""read_at_most / read_capped at their edges: exactly the cap is not "longer", a Content-Length over
the cap is refused unread, and the head returned never exceeds the cap (even when a chunk crosses it)."""

from __future__ import annotations

import asyncio

import pytest

from rlsched.extender.bounded_read import AnswerTooLong, read_at_most, read_capped


class _Content:
    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks, self.read = chunks, 0

    async def iter_chunked(self, n: int):  # noqa: ANN201 - aiohttp's StreamReader.iter_chunked
        for chunk in self.chunks:
            self.read += len(chunk)
            yield chunk


class _Resp:
    """The two things bounded_read uses of an aiohttp.ClientResponse."""

    def __init__(self, chunks: list[bytes], content_length: int | None = None) -> None:
        self.content = _Content(chunks)
        self.content_length = content_length


def run(coro):  # noqa: ANN001, ANN201
    return asyncio.run(coro)


def test_an_answer_of_exactly_the_cap_is_whole() -> None:
    assert run(read_at_most(_Resp([b"abcd", b"efgh"]), 8)) == (b"abcdefgh", False)
    assert run(read_capped(_Resp([b"abcd", b"efgh"], content_length=8), 8)) == b"abcdefgh"
    assert run(read_capped(_Resp([b"abcdefgh"]), 8)) == b"abcdefgh"


def test_the_head_of_a_longer_answer_is_cut_to_the_cap() -> None:
    data, longer = run(read_at_most(_Resp([b"abcdef", b"ghijkl", b"never read"]), 8))
    assert (data, longer) == (b"abcdefgh", True)


def test_a_content_length_over_the_cap_is_refused_unread() -> None:
    resp = _Resp([b"x" * 9], content_length=9)
    with pytest.raises(AnswerTooLong, match="has 9 bytes"):
        run(read_capped(resp, 8))
    assert resp.content.read == 0


def test_an_answer_longer_than_the_cap_without_a_length_is_refused() -> None:
    with pytest.raises(AnswerTooLong, match="longer than the cap of 8"):
        run(read_capped(_Resp([b"x" * 5, b"y" * 5]), 8))
