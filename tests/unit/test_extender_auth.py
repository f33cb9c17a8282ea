"""The status listener's bearer-token checks (TokenReview + SubjectAccessReview) against a fake API
that answers like kube-apiserver: valid, invalid, denied, cached, API down, concurrency, bounds."""

from __future__ import annotations

import asyncio
import logging
import re
from typing import Any

import pytest
import yaml
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry

from rlsched.extender.app import Health, make_status_app
from rlsched.extender.auth import (
    MAX_CONCURRENT_REVIEWS,
    MAX_TOKEN_BYTES,
    SUBJECTACCESSREVIEWS_PATH,
    TOKENREVIEWS_PATH,
    Authenticator,
    TtlCache,
    bearer_token,
)
from rlsched.extender.kubeapi import ApiError
from rlsched.extender.settings import AuthSettings, ConfigError, load_settings, settings_yaml
from rlsched.extender.testing import Harness, make_node

OPERATOR = "system:serviceaccount:rlsched:operator"
NOBODY = "system:serviceaccount:default:nobody"
API_AUDIENCE = "https://kubernetes.default.svc.cluster.local"
"""The API server's own audience (its --service-account-issuer): what a default ServiceAccount token carries."""
AUDIENCE = "rlsched-extender"


class FakeReviewApi:
    """TokenReview and SubjectAccessReview as kube-apiserver answers them, from two tables."""

    def __init__(self) -> None:
        self.tokens = {"op-token": OPERATOR, "nobody-token": NOBODY, "op-aud-token": OPERATOR, "vault-token": OPERATOR}
        self.token_audiences = {"op-aud-token": [AUDIENCE], "vault-token": ["vault"]}
        """Audiences of a token (kubectl create token --audience); the others': the API server's."""
        self.grants = {(OPERATOR, "/status"), (OPERATOR, "/decisions"), (OPERATOR, "/metrics")}
        self.calls: list[tuple[str, Any]] = []
        self.down: ApiError | None = None
        self.delay_s = 0.0
        self.gate: asyncio.Event | None = None

    async def request(
        self, method: str, path: str, body: Any = None, content_type: str = "application/json", timeout: float = 10.0
    ) -> Any:
        assert method == "POST"
        self.calls.append((path, body))
        if self.gate is not None:
            await self.gate.wait()
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if self.down is not None:
            raise self.down
        if path == TOKENREVIEWS_PATH:
            assert body["kind"] == "TokenReview" and body["apiVersion"] == "authentication.k8s.io/v1"
            token = body["spec"]["token"]
            user = self.tokens.get(token)
            if user is None:
                return {"kind": "TokenReview", "status": {"authenticated": False, "error": "invalid bearer token"}}
            # kube-apiserver: the token must be made for one of the audiences asked (none asked: its
            # own), and the answer names those it matched.
            asked = body["spec"].get("audiences") or [API_AUDIENCE]
            matched = [a for a in asked if a in self.token_audiences.get(token, [API_AUDIENCE])]
            if not matched:
                error = f"invalid bearer token, token audiences are invalid for the target audiences {asked}"
                return {"kind": "TokenReview", "status": {"authenticated": False, "error": error}}
            return {
                "kind": "TokenReview",
                "status": {
                    "authenticated": True,
                    "audiences": matched,
                    "user": {
                        "username": user,
                        "uid": "u-1",
                        "groups": ["system:serviceaccounts", "system:authenticated"],
                        "extra": {"authentication.kubernetes.io/pod-name": ["op-0"]},
                    },
                },
            }
        assert path == SUBJECTACCESSREVIEWS_PATH
        spec = body["spec"]
        assert body["kind"] == "SubjectAccessReview" and spec["groups"] and spec["uid"] == "u-1"
        assert spec["extra"] == {"authentication.kubernetes.io/pod-name": ["op-0"]}
        attrs = spec["nonResourceAttributes"]
        assert attrs["verb"] == "get" and "resourceAttributes" not in spec
        allowed = (spec["user"], attrs["path"]) in self.grants
        return {
            "kind": "SubjectAccessReview",
            "status": {"allowed": allowed, **({} if allowed else {"reason": "no RBAC rule"})},
        }

    def count(self, path: str) -> int:
        return sum(1 for p, _ in self.calls if p == path)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def authenticator(api: FakeReviewApi, clock: Clock | None = None, **settings: Any) -> Authenticator:
    return Authenticator(api, AuthSettings(**settings), CollectorRegistry(), clock=clock or Clock())


def status_client(
    api: FakeReviewApi, protect_metrics: bool = False, **settings: Any
) -> tuple[TestClient, Authenticator]:
    h = Harness([make_node("g0", gpus=2)])
    health = Health()
    health.started = True
    auth = Authenticator(api, AuthSettings(**settings), h.metrics.registry)
    app = make_status_app(h.extender, h.metrics, health, auth=auth, protect_metrics=protect_metrics)
    return TestClient(TestServer(app)), auth


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def test_endpoints_answer_by_the_contract() -> None:
    api = FakeReviewApi()
    client, _ = status_client(api)
    async with client:
        for path in ("/healthz", "/readyz", "/metrics"):  # open: probes, and /metrics on loopback by default
            assert (await client.get(path)).status == 200, path
        assert not api.calls
        for path in ("/status", "/decisions"):
            r = await client.get(path)
            assert r.status == 401 and r.headers["WWW-Authenticate"].startswith("Bearer")
            assert "Authorization: Bearer" in (await r.json())["Error"]
            r = await client.get(path, headers=bearer("forged"))
            assert r.status == 401 and r.headers["WWW-Authenticate"].startswith("Bearer")
            assert "not accepted: invalid bearer token" in (await r.json())["Error"]
            r = await client.get(path, headers=bearer("nobody-token"))
            body = await r.json()
            assert r.status == 403 and NOBODY in body["Error"] and f'nonResourceURLs ["{path}"]' in body["Error"]
            r = await client.get(path, headers=bearer("op-token"))
            assert r.status == 200, await r.text()
        r = await client.get("/decisions?after=0&limit=5", headers=bearer("op-token"))
        assert r.status == 200 and "records" in await r.json()
        # the route decides, not the raw path: an escaped /status is still /status
        assert (await client.get("/%73tatus")).status == 401
        # the SAR asked for exactly the path and verb get
        sars = [b["spec"]["nonResourceAttributes"] for p, b in api.calls if p == SUBJECTACCESSREVIEWS_PATH]
        assert {"path": "/decisions", "verb": "get"} in sars and {"path": "/status", "verb": "get"} in sars
        metrics = await (await client.get("/metrics")).text()
    assert 'rlsched_extender_auth_requests_total{result="allowed"} 3.0' in metrics
    assert 'rlsched_extender_auth_requests_total{result="forbidden"} 2.0' in metrics
    assert 'rlsched_extender_auth_requests_total{result="unauthenticated"} 5.0' in metrics


async def test_protect_metrics_guards_metrics_only_then() -> None:
    api = FakeReviewApi()
    client, _ = status_client(api, protect_metrics=True)
    async with client:
        assert (await client.get("/metrics")).status == 401
        assert (await client.get("/metrics", headers=bearer("nobody-token"))).status == 403
        assert (await client.get("/metrics", headers=bearer("op-token"))).status == 200
        assert (await client.get("/healthz")).status == 200 and (await client.get("/readyz")).status == 200


async def test_answers_are_cached_and_expire() -> None:
    api, clock = FakeReviewApi(), Clock()
    auth = authenticator(api, clock, cache_ttl_s=30.0, negative_cache_ttl_s=5.0)
    for _ in range(5):
        assert (await auth.check("Bearer op-token", "/status")).allowed
    assert api.count(TOKENREVIEWS_PATH) == 1 and api.count(SUBJECTACCESSREVIEWS_PATH) == 1
    # another path: the identity is cached, only a new SAR
    assert (await auth.check("Bearer op-token", "/decisions")).allowed
    assert api.count(TOKENREVIEWS_PATH) == 1 and api.count(SUBJECTACCESSREVIEWS_PATH) == 2
    # refusals are cached too, for the shorter TTL
    for _ in range(3):
        assert (await auth.check("Bearer forged", "/status")).status == 401
        assert (await auth.check("Bearer nobody-token", "/status")).status == 403
    assert api.count(TOKENREVIEWS_PATH) == 3 and api.count(SUBJECTACCESSREVIEWS_PATH) == 3
    # a grant made now works once the negative TTL has passed ...
    api.grants.add((NOBODY, "/status"))
    clock.now += 4.9
    assert (await auth.check("Bearer nobody-token", "/status")).status == 403
    clock.now += 0.2
    assert (await auth.check("Bearer nobody-token", "/status")).allowed
    # ... and a revoked one stops working after the positive TTL
    api.grants.discard((OPERATOR, "/status"))
    clock.now += 24.0
    assert (await auth.check("Bearer op-token", "/status")).allowed
    clock.now += 6.0
    assert (await auth.check("Bearer op-token", "/status")).status == 403


async def test_api_down_is_503_not_cached_and_logged_without_the_token(caplog) -> None:
    api = FakeReviewApi()
    api.down = ApiError(0, "Unreachable", "POST tokenreviews: cannot reach the API server")
    client, auth = status_client(api)
    secret = "op-token"
    async with client:
        with caplog.at_level(logging.INFO, logger="rlsched.extender.auth"):
            r = await client.get("/decisions", headers=bearer(secret))
            assert r.status == 503 and r.headers["Retry-After"]
            assert "cannot check the token now" in (await r.json())["Error"]
            api.down = None  # the API server is back: the next request is checked again, not refused from a cache
            assert (await client.get("/decisions", headers=bearer(secret))).status == 200
            api.down = ApiError(403, "Forbidden", "tokenreviews.authentication.k8s.io is forbidden")
            r = await client.get("/status", headers=bearer("nobody-token"))
            assert r.status == 503 and "system:auth-delegator" in (await r.json())["Error"]
        metrics = await (await client.get("/metrics")).text()
    assert 'rlsched_extender_auth_requests_total{result="unavailable"} 2.0' in metrics
    assert 'rlsched_extender_auth_reviews_total{kind="token",result="error"} 2.0' in metrics
    assert caplog.records and all(
        secret not in r.getMessage() and "nobody-token" not in r.getMessage() for r in caplog.records
    )


async def test_a_hanging_api_times_out_as_503() -> None:
    api = FakeReviewApi()
    auth = authenticator(api, review_timeout_s=0.05)

    async def request(method: str, path: str, body: Any = None, content_type: str = "", timeout: float = 10.0) -> Any:
        try:
            return await asyncio.wait_for(asyncio.sleep(5.0), timeout)
        except TimeoutError:
            raise ApiError(0, "Timeout", f"{path}: no answer within {timeout:g} s") from None

    api.request = request  # type: ignore[method-assign]  # KubeApi's timeout behaviour
    verdict = await asyncio.wait_for(auth.check("Bearer op-token", "/status"), 2.0)
    assert verdict.status == 503 and "no answer" in verdict.reason


async def test_an_answer_that_is_not_json_is_503() -> None:
    api = FakeReviewApi()
    api.down = ValueError("unexpected character: line 1 column 1 (char 0)")  # type: ignore[assignment]  # orjson's error
    verdict = await authenticator(api).check("Bearer op-token", "/status")
    assert verdict.status == 503 and "TokenReview" in verdict.reason


async def test_identical_checks_share_one_review_and_reviews_are_bounded() -> None:
    api = FakeReviewApi()
    api.gate = asyncio.Event()
    auth = authenticator(api, review_timeout_s=5.0)
    same = [asyncio.create_task(auth.check("Bearer op-token", "/status")) for _ in range(20)]
    fresh = [asyncio.create_task(auth.check(f"Bearer t{i}", "/status")) for i in range(40)]
    await asyncio.sleep(0.05)
    assert len(api.calls) == MAX_CONCURRENT_REVIEWS  # the rest wait for a slot
    api.gate.set()
    verdicts = await asyncio.gather(*same, *fresh)
    assert all(v.allowed for v in verdicts[:20]) and all(v.status == 401 for v in verdicts[20:])
    assert api.count(TOKENREVIEWS_PATH) == 41 and api.count(SUBJECTACCESSREVIEWS_PATH) == 1


@pytest.mark.parametrize(
    "header, why",
    [
        (None, "authentication required"),
        ("", "authentication required"),
        ("Basic dXNlcjpwYXNz", "Bearer scheme"),
        ("Bearer ", "empty bearer token"),
        ("Bearer " + "a" * (MAX_TOKEN_BYTES + 1), f"longer than {MAX_TOKEN_BYTES}"),
        ("Bearer tok en", "characters no token has"),
        ("Bearer tökén", "characters no token has"),
        ("Bearer a\x00b", "characters no token has"),
    ],
)
async def test_malformed_headers_are_401_without_asking_the_api(header, why) -> None:
    api = FakeReviewApi()
    auth = authenticator(api)
    verdict = await auth.check(header, "/status")
    assert verdict.status == 401 and why in verdict.reason and not api.calls
    if header and len(header) > 20:
        assert header[7:] not in verdict.reason  # the token is never echoed


def test_bearer_scheme_is_case_insensitive() -> None:
    assert bearer_token("bearer abc.def") == "abc.def" and bearer_token("BEARER  x") == "x"


def test_ttl_cache_is_bounded_lru() -> None:
    clock = Clock()
    cache: TtlCache[str, int] = TtlCache(3, clock)
    for i, key in enumerate("abcd"):
        cache.put(key, i, 10.0)
    assert len(cache) == 3 and cache.get("a") is None and cache.get("b") == 1
    cache.put("e", 4, 10.0)  # b was used last: c goes
    assert cache.get("c") is None and cache.get("b") == 1
    clock.now += 10.0
    assert cache.get("b") is None
    cache.put("z", 9, 0.0)  # TTL 0: not cached at all
    assert cache.get("z") is None


@pytest.mark.parametrize(
    "user, why",
    [
        ({"extra": ["x"]}, "user.extra"),
        ({"extra": {"k": "v"}}, "user.extra"),
        ({"extra": {"k": [1]}}, "user.extra"),
        ({"groups": 5}, "user.groups"),
        ({"groups": ["a", None]}, "user.groups"),
        ({"uid": {"a": 1}}, "user.uid"),
    ],
)
async def test_a_token_review_of_the_wrong_shape_is_503_counted_and_logged_once(user, why, caplog) -> None:
    api = FakeReviewApi()
    request = api.request

    async def misshapen(method: str, path: str, body: Any = None, content_type: str = "", timeout: float = 10.0) -> Any:
        answer = await request(method, path, body, content_type, timeout)
        if path == TOKENREVIEWS_PATH:
            answer["status"]["user"].update(user)
        return answer

    api.request = misshapen  # type: ignore[method-assign]
    client, _ = status_client(api)
    async with client:
        with caplog.at_level(logging.WARNING, logger="rlsched.extender.auth"):
            for _ in range(2):
                r = await client.get("/status", headers=bearer("op-token"))
                assert r.status == 503 and r.headers["Retry-After"]
                assert f"TokenReview: {why}" in (await r.json())["Error"]
        metrics = await (await client.get("/metrics")).text()
    assert 'rlsched_extender_auth_reviews_total{kind="token",result="error"} 2.0' in metrics
    assert 'rlsched_extender_auth_reviews_total{kind="token",result="ok"}' not in metrics
    assert 'rlsched_extender_auth_requests_total{result="unavailable"} 2.0' in metrics
    assert api.count(TOKENREVIEWS_PATH) == 2 and api.count(SUBJECTACCESSREVIEWS_PATH) == 0  # 503 is not cached
    assert len([r for r in caplog.records if why in r.getMessage()]) == 1


async def test_a_token_review_with_go_nulls_is_read() -> None:
    specs = []

    class Api:
        async def request(
            self, method: str, path: str, body: Any = None, content_type: str = "", timeout: float = 10.0
        ) -> Any:
            if path == TOKENREVIEWS_PATH:  # nil slices as Go encodes them
                user = {"username": OPERATOR, "uid": None, "groups": None, "extra": {"k": ["v"], "nil": None}}
                return {"status": {"authenticated": True, "user": user}}
            specs.append(body["spec"])
            return {"status": {"allowed": True}}

    auth = Authenticator(Api(), AuthSettings(), CollectorRegistry())
    assert (await auth.check("Bearer op-token", "/status")).allowed
    assert specs[0]["groups"] == [] and "uid" not in specs[0] and specs[0]["extra"] == {"k": ["v"], "nil": []}


# -- token audiences (auth.audiences, auth.apiServerAudience) ------------------------------------------


def token_reviews(api: FakeReviewApi) -> list[list[str] | None]:
    """The audiences each TokenReview asked for (None: none, the API server's own)."""
    return [b["spec"].get("audiences") for p, b in api.calls if p == TOKENREVIEWS_PATH]


def counted(auth: Authenticator, kind: str, result: str) -> float:
    """The value of rlsched_extender_auth_reviews_total{kind, result}."""
    return next(
        s.value
        for m in auth.reviews.collect()
        for s in m.samples
        if s.name.endswith("_total") and s.labels == {"kind": kind, "result": result}
    )


async def test_an_audience_token_is_accepted_with_one_review() -> None:
    api = FakeReviewApi()
    # Without auth.audiences a token made for the extender is refused, as by the API server itself.
    assert (await authenticator(api).check("Bearer op-aud-token", "/status")).status == 401
    assert token_reviews(api) == [None]

    api = FakeReviewApi()
    auth = authenticator(api, audiences=(AUDIENCE,))
    for path in ("/status", "/status", "/decisions"):
        verdict = await auth.check("Bearer op-aud-token", path)
        assert verdict.allowed and verdict.user == OPERATOR, verdict
    assert token_reviews(api) == [[AUDIENCE]]  # one review, cached for the token; a SAR per path
    assert api.count(SUBJECTACCESSREVIEWS_PATH) == 2
    assert counted(auth, "token", "ok") == 1


async def test_a_token_of_another_audience_is_refused_in_the_reviews_it_needs() -> None:
    api, clock = FakeReviewApi(), Clock()
    auth = authenticator(api, clock, audiences=(AUDIENCE,), negative_cache_ttl_s=5.0)
    for _ in range(3):
        verdict = await auth.check("Bearer vault-token", "/status")
        assert verdict.status == 401 and "for audiences ['rlsched-extender']" in verdict.reason, verdict
        assert "for the API server: invalid bearer token" in verdict.reason
        verdict = await auth.check("Bearer vault-token", "/decisions")  # the refusal is the token's, any path
        assert verdict.status == 401
    assert token_reviews(api) == [[AUDIENCE], None] and api.count(SUBJECTACCESSREVIEWS_PATH) == 0
    clock.now += 5.0  # the negative TTL: asked again, in the same two reviews
    assert (await auth.check("Bearer vault-token", "/status")).status == 401
    assert token_reviews(api) == [[AUDIENCE], None] * 2
    # without the API server's audience: one review
    api = FakeReviewApi()
    auth = authenticator(api, audiences=(AUDIENCE,), api_server_audience=False)
    assert (await auth.check("Bearer vault-token", "/status")).status == 401
    assert (await auth.check("Bearer forged", "/status")).status == 401
    assert token_reviews(api) == [[AUDIENCE], [AUDIENCE]]


async def test_a_review_naming_other_audiences_is_refused() -> None:
    """A review that authenticates the token but names none of the audiences asked (an authentication
    webhook answering for another audience) does not let the token in."""
    api = FakeReviewApi()
    request = api.request

    async def other_audience(method: str, path: str, body: Any = None, content_type: str = "", timeout: float = 10.0):
        answer = await request(method, path, body, content_type, timeout)
        if path == TOKENREVIEWS_PATH and body["spec"].get("audiences"):
            answer["status"] = {**answer["status"], "authenticated": True, "audiences": ["vault"]}
            answer["status"].setdefault("user", {"username": OPERATOR, "uid": "u-1", "groups": ["g"]})
        return answer

    api.request = other_audience  # type: ignore[method-assign]
    auth = authenticator(api, audiences=(AUDIENCE,), api_server_audience=False)
    verdict = await auth.check("Bearer op-aud-token", "/status")
    assert verdict.status == 401 and "names only ['vault']" in verdict.reason, verdict
    assert token_reviews(api) == [[AUDIENCE]] and api.count(SUBJECTACCESSREVIEWS_PATH) == 0


async def test_api_server_tokens_fall_back_to_a_second_review() -> None:
    """Prometheus scrapes with its default ServiceAccount token: refused for the extender's audience,
    then accepted by a review for the API server's own; both answers cached for the token."""
    api = FakeReviewApi()
    auth = authenticator(api, audiences=(AUDIENCE,))
    for path in ("/metrics", "/metrics", "/status"):
        assert (await auth.check("Bearer op-token", path)).allowed
    assert token_reviews(api) == [[AUDIENCE], None] and api.count(SUBJECTACCESSREVIEWS_PATH) == 2
    assert counted(auth, "token", "ok") == 2
    # a token the API server does not know at all: refused after the same two reviews
    assert (await auth.check("Bearer forged", "/status")).status == 401
    assert token_reviews(api) == [[AUDIENCE], None, [AUDIENCE], None]


async def test_without_the_api_servers_audience_default_tokens_are_refused() -> None:
    api = FakeReviewApi()
    auth = authenticator(api, audiences=(AUDIENCE,), api_server_audience=False)
    verdict = await auth.check("Bearer op-token", "/status")
    assert verdict.status == 401 and "target audiences ['rlsched-extender']" in verdict.reason, verdict
    assert (await auth.check("Bearer op-aud-token", "/status")).allowed
    assert token_reviews(api) == [[AUDIENCE], [AUDIENCE]]


@pytest.mark.parametrize("api_server_audience, status", [(True, 200), (False, 401)])
async def test_an_audience_blind_review_means_the_api_servers_audience(api_server_audience, status) -> None:
    """An authenticator that ignores audiences answers without status.audiences: by the TokenReview
    API's contract the token is then valid for the API server's audience, and treated as such."""
    api = FakeReviewApi()
    request = api.request

    async def blind(method: str, path: str, body: Any = None, content_type: str = "", timeout: float = 10.0) -> Any:
        if path == TOKENREVIEWS_PATH:
            body = {**body, "spec": {"token": body["spec"]["token"]}}
            answer = await request(method, path, body, content_type, timeout)
            answer["status"].pop("audiences", None)
            return answer
        return await request(method, path, body, content_type, timeout)

    api.request = blind  # type: ignore[method-assign]
    auth = authenticator(api, audiences=(AUDIENCE,), api_server_audience=api_server_audience)
    verdict = await auth.check("Bearer op-token", "/status")
    assert verdict.status == status, verdict
    assert api.count(TOKENREVIEWS_PATH) == 1
    if status == 401:
        assert "auth.apiServerAudience is false" in verdict.reason


async def test_audience_reviews_in_flight_are_shared() -> None:
    api = FakeReviewApi()
    api.gate = asyncio.Event()
    auth = authenticator(api, audiences=(AUDIENCE,))
    checks = [asyncio.create_task(auth.check("Bearer op-token", "/status")) for _ in range(20)]
    await asyncio.sleep(0.05)
    api.gate.set()
    assert all(v.allowed for v in await asyncio.gather(*checks))
    assert token_reviews(api) == [[AUDIENCE], None] and api.count(SUBJECTACCESSREVIEWS_PATH) == 1


async def test_status_audiences_of_the_wrong_shape_are_503() -> None:
    api = FakeReviewApi()
    request = api.request

    async def misshapen(method: str, path: str, body: Any = None, content_type: str = "", timeout: float = 10.0):
        answer = await request(method, path, body, content_type, timeout)
        if path == TOKENREVIEWS_PATH:
            answer["status"]["audiences"] = AUDIENCE  # a string, not a list
        return answer

    api.request = misshapen  # type: ignore[method-assign]
    verdict = await authenticator(api, audiences=(AUDIENCE,)).check("Bearer op-aud-token", "/status")
    assert verdict.status == 503 and "status.audiences" in verdict.reason, verdict


# -- their settings -----------------------------------------------------------------------------------


def test_audience_settings_load_from_file_and_environment(tmp_path) -> None:
    path = tmp_path / "extender.yaml"
    path.write_text("auth:\n  audiences: [rlsched-extender, https://rlsched.example.com]\n  apiServerAudience: false\n")
    s = load_settings(path)
    assert s.auth.audiences == (AUDIENCE, "https://rlsched.example.com") and s.auth.api_server_audience is False
    assert "apiServerAudience: false" in settings_yaml(s.auth)
    s = load_settings(env={"RLSCHED_AUTH_AUDIENCES": "a,b"})
    assert s.auth.audiences == ("a", "b") and s.auth.api_server_audience is True
    # the check spans sources: false in the file, the audiences from the environment
    path.write_text("auth: {apiServerAudience: false}\n")
    assert load_settings(path, env={"RLSCHED_AUTH_AUDIENCES": AUDIENCE}).auth.audiences == (AUDIENCE,)


@pytest.mark.parametrize(
    "auth, why",
    [
        ({"apiServerAudience": False}, "would refuse every token"),
        ({"apiServerAudience": False, "audiences": []}, "would refuse every token"),
        ({"audiences": [""]}, "audiences[0]: expected 1 to 256 visible ASCII"),
        ({"audiences": ["a b"]}, "audiences[0]"),
        ({"audiences": ["ok", "rlsched-éxtender"]}, "audiences[1]"),
        ({"audiences": ["a\nb"]}, "audiences[0]"),
        ({"audiences": ["a" * 257]}, "audiences[0]"),
        ({"audiences": [f"a{i}" for i in range(17)]}, "audiences: at most 16, got 17"),
        ({"audiences": {"a": 1}}, "auth.audiences: expected a list"),
        ({"audiences": [["a"]]}, "expected a string"),
    ],
)
def test_audience_settings_are_refused(tmp_path, auth, why) -> None:
    path = tmp_path / "extender.yaml"
    path.write_text(yaml.safe_dump({"auth": auth}))
    with pytest.raises(ConfigError, match=re.escape(why)):
        load_settings(path)
