"""numpy inference (policy/network.py) scores exactly like the torch agent (policy/ppo/agent.py)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from ppo_fixtures import small_nodes, small_pods, small_typical  # noqa: E402

from rlsched.policy.env import EnvConfig, SchedulingCore  # noqa: E402
from rlsched.policy.features import CLUSTER_FEATURES, NUM_FEATURES  # noqa: E402
from rlsched.policy.network import PolicyNetwork, group_offsets, log_softmax, param_shapes  # noqa: E402
from rlsched.policy.ppo.agent import Agent, RaggedBatch  # noqa: E402
from rlsched.policy.ppo.buffer import RolloutBuffer  # noqa: E402
from rlsched.policy.ppo.trainer import act, step_core  # noqa: E402

C = len(CLUSTER_FEATURES)


def random_agent(seed: int, prior_scale: float = 3.0) -> Agent:
    torch.manual_seed(seed)
    agent = Agent(NUM_FEATURES, C, (16, 12), 10, prior_scale)
    with torch.no_grad():  # make every head matter (the real init shrinks the output layers)
        for p in agent.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    return agent


def random_batch(rng: np.random.Generator, sizes: list[int], special: bool) -> tuple[RaggedBatch, list[np.ndarray]]:
    xs = [rng.normal(size=(g, NUM_FEATURES)).astype(np.float32) for g in sizes]
    seg = np.repeat(np.arange(len(sizes)), sizes)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    r = int(sum(sizes))
    mask = rng.random((len(sizes), 2)) < 0.5 if special else np.zeros((len(sizes), 2), dtype=bool)
    b = RaggedBatch(
        x=torch.from_numpy(np.concatenate(xs) if r else np.zeros((0, NUM_FEATURES), np.float32)),
        prior=torch.from_numpy(rng.normal(size=r).astype(np.float32)),
        offset=torch.from_numpy(rng.normal(size=r).astype(np.float32)),
        count=torch.from_numpy(rng.integers(1, 5, size=r).astype(np.float32)),
        seg=torch.from_numpy(seg),
        row_start=torch.from_numpy(starts),
        cluster=torch.from_numpy(rng.normal(size=(len(sizes), C)).astype(np.float32)),
        special_mask=torch.from_numpy(mask),
    )
    return b, xs


def numpy_reference(net: PolicyNetwork, b: RaggedBatch, i: int) -> tuple[np.ndarray, float, np.ndarray, np.ndarray]:
    """(group scores, value, special logits, log-probs over [groups, delay, reject]) of decision i."""
    rows = (b.seg == i).numpy()
    x = b.x.numpy()[rows]
    h2 = net.hidden(x)
    s = net.scores(x, b.prior.numpy()[rows], h2)
    pooled = net.pooled(h2, b.count.numpy()[rows], b.cluster.numpy()[i])
    special = net.special_logits(pooled)
    z = np.concatenate([s + b.offset.numpy()[rows], np.where(b.special_mask.numpy()[i], special, -np.inf)])
    return s, net.value(pooled), special, log_softmax(z)


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("special", [False, True])
def test_numpy_equals_torch_on_random_inputs(seed: int, special: bool) -> None:
    rng = np.random.default_rng(seed)
    agent = random_agent(seed)
    net = PolicyNetwork(agent.to_arrays(), agent.prior_scale)
    sizes = [int(s) for s in rng.integers(1, 40, size=7)]
    if special:
        sizes[3] = 0  # a decision where no node fits and only delay/reject remain
    b, _ = random_batch(rng, sizes, special)
    if special:
        b.special_mask[3] = torch.tensor([True, True])
    with torch.no_grad():
        scores, values, specials = agent(b)
        actions = torch.tensor([0 if g else -1 for g in sizes])
        _, logprob, entropy, value2 = agent.get_action_and_value(b, actions)
    for i, g in enumerate(sizes):
        s, v, sp, lp = numpy_reference(net, b, i)
        rows = (b.seg == i).numpy()
        np.testing.assert_allclose(scores.numpy()[rows], s, rtol=1e-5, atol=1e-5)
        assert values[i].item() == pytest.approx(v, rel=1e-5, abs=1e-5)
        np.testing.assert_allclose(specials[i].numpy(), sp, rtol=1e-5, atol=1e-5)
        expected = lp[0] if g else lp[g]
        assert logprob[i].item() == pytest.approx(expected, rel=1e-5, abs=1e-5)
        p = np.exp(lp[np.isfinite(lp)])
        assert entropy[i].item() == pytest.approx(-(p * np.log(p)).sum(), rel=1e-4, abs=1e-5)
        assert value2[i].item() == pytest.approx(v, rel=1e-5, abs=1e-5)


def test_arrays_round_trip_and_layout() -> None:
    agent = random_agent(1)
    arrays = agent.to_arrays()
    shapes = param_shapes(NUM_FEATURES, C, (16, 12), 10)
    assert {k: tuple(v.shape) for k, v in arrays.items()} == shapes
    other = Agent(NUM_FEATURES, C, (16, 12), 10, 3.0)
    other.load_arrays(arrays)
    for k, v in other.to_arrays().items():
        np.testing.assert_array_equal(v, arrays[k])


def test_numpy_equals_torch_on_real_states() -> None:
    """Decisions sampled by the numpy policy in the simulator: torch recomputes the same log-probs and values."""
    agent = random_agent(3, prior_scale=50.0)
    net = PolicyNetwork(agent.to_arrays(), agent.prior_scale)
    core = SchedulingCore(small_nodes(), small_pods(), small_typical(), EnvConfig())
    core.reset(7)
    steps = 40
    buf = RolloutBuffer(steps, 1, NUM_FEATURES, C)
    stored = []
    for t in range(steps):
        if core.done:
            core.reset(8 + t)
        d = act(net, core, rank_scale=30.0)
        buf.add(
            t,
            0,
            d["x"],
            d["prior"],
            d["offset"],
            d["count"],
            d["cluster"],
            d["special_mask"],
            d["action"],
            d["logprob"],
            d["value"],
        )
        stored.append(d)
        # offsets are the node-level softmax folded into groups
        r = core.rank_frac[core.candidates.nodes]
        off = group_offsets(core.candidates.group, r, 30.0, core.candidates.num_groups)
        np.testing.assert_allclose(off, d["offset"])
        step_core(core, d["node"], d["action"])
    b, extra = buf.batch(np.arange(steps))
    with torch.no_grad():
        _, logprob, _, value = agent.get_action_and_value(b, extra["actions"])
    np.testing.assert_allclose(logprob.numpy(), [d["logprob"] for d in stored], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(value.numpy(), [d["value"] for d in stored], rtol=1e-5, atol=1e-5)


def test_group_offsets_fold_the_node_softmax() -> None:
    rng = np.random.default_rng(0)
    group = rng.integers(0, 4, size=30)
    group[:4] = np.arange(4)
    r = rng.random(30)
    scores = rng.normal(size=4)
    node_logits = scores[group] - 7.0 * r
    p_node = np.exp(node_logits - node_logits.max())
    p_node /= p_node.sum()
    p_group = np.bincount(group, weights=p_node, minlength=4)
    z = scores + group_offsets(group, r, 7.0, 4)
    np.testing.assert_allclose(np.exp(log_softmax(z)), p_group, rtol=1e-10)
