"""``spec.rebalance``: parsing, bounds, the label selector, agreement with the CRD, the settings."""

from __future__ import annotations

from typing import Any

import pytest

from rlsched.operator.rebalance_budget import (
    HOUR_S,
    KEEP_S,
    MAX_CLOCK_SKEW_S,
    MAX_RECENT,
    MAX_WITHDRAWN,
    Ledger,
    allowance,
    owners_over_budget,
)
from rlsched.operator.rebalance_select import namespace_watched
from rlsched.operator.rebalance_spec import LabelSelector, RebalanceSpec, Requirement, schema_defaults
from rlsched.operator.settings import SettingsError, load_settings
from rlsched.operator.spec import SpecError, crd_manifest, parse_spec


def rebalance_schema() -> dict:
    return crd_manifest()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"][
        "rebalance"
    ]


def crd_defaults(node: dict) -> Any:
    if "default" in node:
        return node["default"]
    props = node.get("properties") or {}
    out = {k: crd_defaults(v) for k, v in props.items()}
    return {k: v for k, v in out.items() if v is not None} or None


def test_off_and_cautious_by_default() -> None:
    r = parse_spec({}).rebalance
    assert r == RebalanceSpec() and not r.enabled and r.dry_run
    assert (r.max_moves_per_cycle, r.max_moves_per_hour, r.max_moves_per_owner) == (1, 6, 1)
    assert r.namespace_selector is None


def test_the_crd_states_the_same_defaults() -> None:
    assert crd_defaults(rebalance_schema()) == schema_defaults()


def test_a_full_spec() -> None:
    r = parse_spec(
        {
            "rebalance": {
                "enabled": True,
                "dryRun": False,
                "intervalSeconds": 30,
                "minPodAgeSeconds": 0,
                "namespaceSelector": {
                    "matchLabels": {"team": "ml"},
                    "matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["prod"]}],
                },
                "budget": {
                    "maxMovesPerCycle": 3,
                    "maxMovesPerHour": 0,
                    "maxMovesPerOwner": 2,
                    "ownerWindowSeconds": 60,
                },
                "weights": {
                    "fragmentation": 2,
                    "hot": 0,
                    "migrationCost": 50.5,
                    "minGain": 1,
                    "hotThreshold": 0.75,
                    "latencySensitiveHot": 0.5,
                    "latencySensitive": -0.25,
                    "podGpu": -0.01,
                    "destinationLoad": -1,
                },
            }
        }
    ).rebalance
    assert r.enabled and not r.dry_run and r.interval_s == 30 and r.min_pod_age_s == 0
    assert r.max_moves_per_hour == 0 and r.owner_window_s == 60 and r.migration_cost == 50.5
    assert (
        r.latency_sensitive_hot_weight,
        r.latency_sensitive_weight,
        r.pod_gpu_weight,
        r.destination_load_weight,
    ) == (
        0.5,
        -0.25,
        -0.01,
        -1.0,
    )
    assert r.namespace_selector == LabelSelector(
        (("team", "ml"),), (Requirement("tier", "NotIn", frozenset({"prod"})),)
    )
    sel = r.namespace_selector
    assert sel.matches({"team": "ml"}) and sel.matches({"team": "ml", "tier": "dev"})
    assert not sel.matches({"team": "ml", "tier": "prod"}) and not sel.matches({})


@pytest.mark.parametrize(
    ("rebalance", "fragment"),
    [
        ("yes", "spec.rebalance: expected an object"),
        ({"enabled": "true"}, "spec.rebalance.enabled"),
        ({"intervalSeconds": 1}, "spec.rebalance.intervalSeconds"),
        ({"intervalSeconds": 10**30}, "spec.rebalance.intervalSeconds"),
        ({"minPodAgeSeconds": 1.5}, "spec.rebalance.minPodAgeSeconds"),
        ({"budget": {"maxMovesPerCycle": 0}}, "spec.rebalance.budget.maxMovesPerCycle"),
        ({"budget": {"maxMovesPerHour": True}}, "spec.rebalance.budget.maxMovesPerHour"),
        ({"budget": {"perDay": 1}}, "spec.rebalance.budget.perDay: unknown field"),
        ({"weights": {"hotThreshold": 2}}, "spec.rebalance.weights.hotThreshold"),
        ({"weights": {"minGain": float("nan")}}, "spec.rebalance.weights.minGain"),
        ({"weights": []}, "spec.rebalance.weights: expected an object"),
        ({"weights": {"hot": 0.5, "latencySensitiveHot": -1}}, "makes hot + latencySensitiveHot negative"),
        ({"weights": {"podGpu": 1000}}, "spec.rebalance.weights.podGpu"),
        ({"weights": {"heat": 1}}, "spec.rebalance.weights.heat: unknown field"),
        ({"dryrun": False}, "spec.rebalance.dryrun: unknown field"),
        ({"namespaceSelector": {"matchLabels": {"bad key!": "x"}}}, "is not a label key"),
        ({"namespaceSelector": {"matchLabels": {"k": "x" * 64}}}, "is not a label value"),
        # a trailing newline is not a label key or value (``$`` would let it through)
        ({"namespaceSelector": {"matchLabels": {"team\n": "x"}}}, "is not a label key"),
        ({"namespaceSelector": {"matchLabels": {"team": "x\n"}}}, "is not a label value"),
        (
            {"namespaceSelector": {"matchExpressions": [{"key": "team\n", "operator": "DoesNotExist"}]}},
            "is not a label key",
        ),
        ({"namespaceSelector": {"matchExpressions": [{"key": "k", "operator": "Near"}]}}, "operator"),
        ({"namespaceSelector": {"matchExpressions": [{"key": "k", "operator": "In"}]}}, "needs at least one value"),
        (
            {"namespaceSelector": {"matchExpressions": [{"key": "k", "operator": "Exists", "values": ["a"]}]}},
            "no values",
        ),
        ({"namespaceSelector": {"matchLabels": {f"k{i}": "v" for i in range(40)}}}, "at most 32"),
        (
            {"namespaceSelector": {"matchExpressions": [{"key": "k", "operator": "In", "values": ["v"] * 65}]}},
            "at most 64",
        ),
    ],
)
def test_invalid_names_the_field(rebalance: Any, fragment: str) -> None:
    with pytest.raises(SpecError) as err:
        parse_spec({"rebalance": rebalance})
    assert any(fragment in p for p in err.value.problems), err.value.problems


def test_every_problem_at_once_and_bounded() -> None:
    with pytest.raises(SpecError) as err:
        parse_spec(
            {"rebalance": {"enabled": 1, "budget": {"maxMovesPerCycle": -1}, **{f"x{i}": 1 for i in range(1000)}}}
        )
    assert len(err.value.problems) <= 12 and any("enabled" in p for p in err.value.problems)


def test_an_empty_selector_matches_every_namespace() -> None:
    r = parse_spec({"rebalance": {"namespaceSelector": {}}}).rebalance
    assert r.namespace_selector == LabelSelector() and r.namespace_selector.matches({"any": "thing"})


def test_settings() -> None:
    s = load_settings(None, {"rebalancer.tickS": 1, "rebalancer.enabled": False})
    assert s.rebalancer.tick_s == 1 and not s.rebalancer.enabled
    with pytest.raises(SettingsError, match="tickS"):
        load_settings(None, {"rebalancer.tickS": 0})
    with pytest.raises(SettingsError, match="unknown setting"):
        load_settings(None, {"rebalancer.tick": 1})


def test_the_ledger_reads_back_only_what_makes_sense() -> None:
    ledger = Ledger()
    recent = [
        {"at": 100.0, "owner": "a"},
        {"at": "x", "owner": "b"},
        "junk",
        {"at": float("nan"), "owner": "c"},
        {"at": 50},
    ]
    taken = ledger.merge(recent, 100.0)
    assert taken == 1 and ledger.merge(recent, 100.0) == 0  # the same eviction is not counted twice
    ledger.add("a", 200.0)
    assert ledger.owner_moves("a", 300.0, 150.0) == 1 and ledger.in_last_hour(300.0) == 2
    ledger.prune(100.0 + KEEP_S)
    assert ledger.dump() == [{"at": 200.0, "owner": "a"}]
    assert Ledger().merge({"not": "a list"}, 100.0) == 0


def test_the_ledger_drops_restored_evictions_dated_in_the_future_or_outside_the_windows(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An entry dated far ahead would never be pruned and would count in every hour: the hourly budget
    exhausted for good. Dropped on restore (logged once, with how many); a little clock skew is kept."""
    now, day = 1_800_000_000.0, 86_400.0
    recent = [
        {"at": 1e18, "owner": "ns/ReplicaSet/x"},
        {"at": float("inf"), "owner": "ns/ReplicaSet/x"},
        {"at": now + MAX_CLOCK_SKEW_S + 1, "owner": "ns/ReplicaSet/x"},
        {"at": now + MAX_CLOCK_SKEW_S / 2, "owner": "ns/ReplicaSet/skewed"},  # kept: another node's clock
        {"at": now - 60, "owner": "ns/ReplicaSet/recent"},
        {"at": now - KEEP_S, "owner": "ns/ReplicaSet/old"},  # outside every window a spec may set
        {"at": float("-inf"), "owner": "ns/ReplicaSet/old"},
    ]
    ledger = Ledger()
    with caplog.at_level("WARNING", logger="rlsched.operator.rebalancer"):
        assert ledger.merge(recent, now) == 2
    assert [r.owner for r in ledger.records] == ["ns/ReplicaSet/recent", "ns/ReplicaSet/skewed"]
    (warning,) = [r.getMessage() for r in caplog.records]
    assert "3 eviction(s)" in warning and "future" in warning
    assert allowance(ledger, now + HOUR_S + MAX_CLOCK_SKEW_S, 1, 1, day).left == 1  # the hour does pass
    ledger.prune(now + KEEP_S + MAX_CLOCK_SKEW_S)
    assert ledger.dump() == []  # and nothing is written back for ever


def test_the_ledger_merges_the_status_every_cycle_without_counting_twice() -> None:
    """The status may hold evictions this process never made (another replica's, while this one was
    paused): they are merged on every call, not only the first; the ledger's own, read back at the
    status' precision (milliseconds), are not added again."""
    now, day = 1_800_000_000.0, 86_400.0
    ledger = Ledger()
    mine = ledger.add("ns/ReplicaSet/mine", now - 10.0004)
    assert ledger.merge(ledger.dump(), now) == 0 and ledger.records == [mine]
    other = {"at": now - 5, "owner": "ns/ReplicaSet/other"}
    assert ledger.merge([other], now) == 1
    assert ledger.merge([other, *ledger.dump()], now) == 0
    assert ledger.in_last_hour(now) == 2 and ledger.owner_moves("ns/ReplicaSet/other", now, day) == 1


def test_merging_never_grows_the_ledger_past_its_cap() -> None:
    """A status edited to hold more evictions than the ledger keeps: the newest are taken, the ledger is
    full, and a full ledger spends the budget (a move is never made because the list overflowed)."""
    now, day = 1_800_000_000.0, 86_400.0
    ledger = Ledger()
    for i in range(MAX_RECENT - 2):
        ledger.add(f"ns/ReplicaSet/own-{i}", now - 100 - i)
    edited = [{"at": now - i, "owner": f"ns/ReplicaSet/edited-{i}"} for i in range(5)]
    assert ledger.merge(edited, now) == 5 and len(ledger.records) == MAX_RECENT
    owners = {r.owner for r in ledger.records}
    assert {f"ns/ReplicaSet/edited-{i}" for i in range(5)} <= owners  # the newest of the union
    assert not {f"ns/ReplicaSet/own-{i}" for i in range(MAX_RECENT - 5, MAX_RECENT - 2)} & owners
    assert allowance(ledger, now, 5, 10_000, day).left == 0


def test_a_full_ledger_keeps_another_replicas_newer_eviction() -> None:
    """The cap was applied to the status' records only, so a full ledger kept its own older records and
    dropped another replica's newer one (and the next status write erased it), against the docs."""
    now = 1_800_000_000.0
    ledger = Ledger()
    for i in range(MAX_RECENT):
        ledger.add(f"o{i}", now - 80_000 + i)
    assert ledger.merge([{"at": now - 5, "owner": "ns/Deployment/x"}], now) == 1
    assert "ns/Deployment/x" in {r.owner for r in ledger.records} and len(ledger.records) == MAX_RECENT


def test_a_withdrawn_record_does_not_come_back_from_a_status_that_still_lists_it() -> None:
    """An eviction written ahead and then refused is taken back; when the cycle's status patch did not
    land, the status still lists it, and the next merge counted it again for a whole window."""
    now = 1_800_000_000.0
    ledger = Ledger()
    ahead = ledger.add("ns/ReplicaSet/a", now)
    stale = ledger.dump()
    ledger.discard(ahead)
    assert ledger.merge(stale, now + 400) == 0 and ledger.records == []
    ledger.prune(now + KEEP_S + 1)  # out of every window: forgotten
    assert ledger.withdrawn == {}


def test_refusals_every_cycle_for_30_days_never_bring_a_recent_refused_eviction_back() -> None:
    """A PodDisruptionBudget refusing the planner's pick every cycle (about 300 a day) for the longest
    window: each refused eviction's write ahead landed, the cycle's patch did not, so the next cycle reads
    a status that still lists it. The withdrawn memory was kept 30 days under a cap of 1,000 that then
    refused new entries: from the fourth day on, each such refusal counted again for a whole window."""
    now, cycle_s = 1_800_000_000.0, 288.0
    ledger: Ledger = Ledger()
    status: list[dict[str, Any]] = []
    listed_earlier: list[dict[str, Any]] = []
    for k in range(300 * 30):
        t = now + k * cycle_s
        assert ledger.merge(status, t) == 0, f"a refused eviction counted again on day {k * cycle_s / 86400:.1f}"
        ledger.prune(t)
        assert ledger.records == [] and len(ledger.withdrawn) <= MAX_WITHDRAWN
        ahead = ledger.add(f"ns/Deployment/pdb-protected-{k % 5}", t)
        status = ledger.dump()  # written ahead: it lands
        ledger.discard(ahead)  # refused (429); the cycle's status patch is lost
        if k == 300 * 30 - MAX_WITHDRAWN:  # the earliest refusal still remembered at the end
            listed_earlier = status
    t = now + 300 * 30 * cycle_s
    # A status MAX_WITHDRAWN withdrawals old (only that many cycles without a status write keep one) counts no more.
    assert ledger.merge(listed_earlier, t) == 0
    assert ledger.owner_moves("ns/Deployment/pdb-protected-4", t, 86400) == 0 and ledger.in_last_hour(t) == 0


def test_the_earliest_withdrawn_is_forgotten_first_and_only_past_the_cap() -> None:
    now = 1_800_000_000.0
    ledger = Ledger()
    for k in range(MAX_WITHDRAWN + 1):
        ledger.discard(ledger.add(f"ns/ReplicaSet/r-{k}", now + k))
    assert len(ledger.withdrawn) == MAX_WITHDRAWN
    first, second = {"at": now, "owner": "ns/ReplicaSet/r-0"}, {"at": now + 1, "owner": "ns/ReplicaSet/r-1"}
    assert ledger.merge([second], now + MAX_WITHDRAWN + 10) == 0  # still remembered
    assert ledger.merge([first], now + MAX_WITHDRAWN + 10) == 1  # the earliest went: a move fewer, not one more


def test_a_shorter_window_forgets_nothing_until_the_ledger_is_full() -> None:
    """The documented limit (docs/operator.md, "The budget, and where it lives"): a cycle under a 1-day
    window keeps the evictions a 30-day window counts while the ledger has room; once it holds MAX_RECENT
    records, a new eviction pushes out the oldest, which a 30-day window set back no longer counts."""
    now, day = 1_800_000_000.0, 86_400.0
    ledger = Ledger()
    for i in range(MAX_RECENT - 1):
        ledger.add(f"ns/ReplicaSet/rs-{i}", now - 20 * day + i * 1700)
    ledger.prune(now)  # a real cycle with ownerWindowSeconds: 86400
    ledger.add("ns/ReplicaSet/new-0", now)
    assert owners_over_budget(ledger, ["ns/ReplicaSet/rs-0"], now + 600, 1, 30 * day) == {"ns/ReplicaSet/rs-0"}
    ledger.add("ns/ReplicaSet/new-1", now + 1)  # full: the oldest goes, outside the 1-day window
    assert len(ledger.records) == MAX_RECENT
    assert owners_over_budget(ledger, ["ns/ReplicaSet/rs-0"], now + 600, 1, 30 * day) == set()


@pytest.mark.parametrize(
    "pattern",
    ["team", "team-*", "!kube-system", "team-*, !*-pr-*, *pr-123", "!*-pr-*, *pr-123", "a?c", "*"],
)
def test_the_watched_namespaces_are_read_as_kopf_reads_them(pattern: str) -> None:
    from kopf._cogs.structs.references import match_namespace

    watched = namespace_watched([pattern])
    for ns in ["team", "team-a", "team-pr-5", "team-pr-123", "other-pr-123", "kube-system", "abc", "default"]:
        assert watched(ns) is match_namespace(ns, pattern), (ns, pattern)
    assert namespace_watched([])("anything") and namespace_watched(["a", "b"])("b")
    assert not namespace_watched(["a", "b"])("c")
