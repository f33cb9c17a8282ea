"""The authenticator fails closed on answers that are not exactly true, and the token cap is 8192
bytes (the documented value, not just "whatever MAX_TOKEN_BYTES is")."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from rlsched.extender.auth import TOKENREVIEWS_PATH, Authenticator, Verdict, bearer_token
from rlsched.extender.settings import AuthSettings


class _Api:
    """A TokenReview / SubjectAccessReview answering with the given ``authenticated`` / ``allowed``."""

    def __init__(self, authenticated: Any = True, allowed: Any = True) -> None:
        self.authenticated, self.allowed = authenticated, allowed
        self.paths: list[str] = []

    async def request(
        self, method: str, path: str, body: Any = None, content_type: str = "", timeout: float = 10.0
    ) -> Any:
        self.paths.append(path)
        if path == TOKENREVIEWS_PATH:
            return {"status": {"authenticated": self.authenticated, "user": {"username": "u", "groups": ["g"]}}}
        return {"status": {"allowed": self.allowed}}


def _auth(api: _Api) -> Authenticator:
    return Authenticator(api, AuthSettings(), CollectorRegistry())


@pytest.mark.parametrize("authenticated", ["true", "false", 1, [True], {"x": 1}])
async def test_a_token_review_authenticated_only_by_json_true(authenticated: Any) -> None:
    api = _Api(authenticated=authenticated)
    verdict = await _auth(api).check("Bearer tok", "/status")
    assert verdict.status == 401 and not verdict.allowed
    assert api.paths == [TOKENREVIEWS_PATH]  # never reaches the access review


@pytest.mark.parametrize("allowed", ["true", "false", 1, [True], {"x": 1}])
async def test_an_access_review_allows_only_json_true(allowed: Any) -> None:
    verdict = await _auth(_Api(allowed=allowed)).check("Bearer tok", "/status")
    assert verdict.status == 403 and not verdict.allowed


def test_the_token_cap_is_8192_bytes() -> None:
    assert bearer_token("Bearer " + "a" * 8192) == "a" * 8192
    over = bearer_token("Bearer " + "a" * 8193)
    assert isinstance(over, Verdict) and over.status == 401 and "longer than 8192" in over.reason
