"""The vine training loop: PPO's clipped objective on branch-rollout advantages.

``train_vine(args)`` is what ``rlsched train --advantage vine`` runs (docs/ppo.md, "Learning from
branch rollouts"). Each iteration: ``vine_trunks`` workload seeds are played by the current policy in
``workers`` processes; at ``vine_points`` states of each, the ``vine_actions`` likeliest groups are
each played to the episode's end in a copy of the simulation with the same future
(:mod:`rlsched.policy.ppo.vine`); then ``update_epochs`` passes of minibatch updates of the clipped
surrogate over (state, tried action) pairs. Seeds, validation, export and checkpoints follow the GAE
loop (:func:`rlsched.policy.ppo.trainer.train`): the same ``Args``, the same run folder, the same atomic
checkpoint write, and a checkpoint when the loop ends (its last iteration, ``max_iterations`` or
``max_minutes``).
"""

from __future__ import annotations

import math
import multiprocessing
import pickle
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict

import numpy as np
import torch
from torch import nn

from ..env import SchedulingCore
from ..evaluate import default_jobs
from ..network import PolicyNetwork
from ..playout import play_out
from .config import Args, vine_problem
from .trainer import (
    RunOutput,
    TrainResult,
    explained_variance,
    make_cores,
    make_optimizer,
    new_agent,
    numpy_net,
    out_of_budget,
    prepare_args,
    seed_everything,
    set_lr,
    write_checkpoint,
)
from .vine import BranchBatch, branch_points, set_worker_cores, trunk_job, vine_loss


def validate_mode(net: PolicyNetwork, args: Args, seeds: Sequence[int], core: SchedulingCore) -> list[float]:
    """Unallocated GPU % at 100 % arrival of the policy played in ``rollout_mode`` on held-out seeds."""
    out = []
    for seed in seeds:
        core.reset(seed)
        play_out(net, core, args.rank_scale, args.rollout_mode)
        out.append(core.unallocated_at_100())
    return out


def trunk_jobs(args: Args, params: dict[str, np.ndarray], iteration: int, seed0: int) -> list[dict]:
    """The iteration's trunks: workload seeds, traces (trunk ``t`` plays trace ``t mod len(traces)``, as
    env ``e`` does in the GAE loop) and branch states, a pure function of the seed and iteration (so a
    resumed run plays exactly what an uninterrupted one would)."""
    jobs = []
    for t in range(args.vine_trunks):
        rng = np.random.default_rng([args.seed, iteration, t])
        jobs.append(
            {
                "params": params,
                "prior_scale": args.prior_scale,
                "seed": seed0 + (iteration - 1) * args.vine_trunks + t,
                "trace": t % len(args.traces),
                "points": branch_points(rng, args.vine_window, args.vine_points),
                "actions": args.vine_actions,
                "rank_scale": args.rank_scale,
                "mode": args.rollout_mode,
            }
        )
    return jobs


def train_vine(args: Args) -> TrainResult:
    """Run PPO on vine advantages; returns where the exported model went and the validation figures."""
    start_time = time.time()
    args, ckpt = prepare_args(args)
    problem = vine_problem(args)  # rlsched train refuses these before it starts; the API here
    if problem:
        raise ValueError(problem)
    seed_everything(args)
    num_iterations = max(1, args.total_timesteps // max(1, args.vine_trunks * args.vine_points))
    # one simulation per trace; validation plays the first
    cores = make_cores(Args(**{**asdict(args), "num_envs": len(args.traces)}), args.end_at)
    core = cores[0]
    agent = new_agent(args)
    optimizer = make_optimizer(agent, args)
    history: list[dict] = []
    first_iteration, elapsed_before, best_val = 1, 0.0, None
    # what the next iteration and the final validation cost, for the max_minutes check (None: not timed yet)
    iteration_s, validation_s, validation_guess = 0.0, None, 0.0
    if ckpt is not None:
        agent.load_state_dict(ckpt["agent"])
        optimizer.load_state_dict(ckpt["optimizer"])
        torch.set_rng_state(ckpt["torch_rng"])
        history, best_val = ckpt["history"], ckpt["best_val"]
        first_iteration, elapsed_before = ckpt["iteration"] + 1, ckpt["elapsed"]
        timed = [h["iteration_s"] for h in history if h.get("iteration_s")]
        iteration_s = ckpt.get("iteration_s", timed[-1] if timed else 0.0)
        validation_s = ckpt.get("validation_s")
    seed0 = args.train_seed0 + 10_000 * args.seed
    out = RunOutput(args, core.typical.to_json(), f"{seed0}+", best_val)

    if not args.resume and args.eval_every:
        # the starting policy is a candidate too: training must beat it on validation to replace it
        val_start = time.time()
        start_val = float(np.mean(validate_mode(numpy_net(agent, args), args, args.val_seeds, core)))
        validation_s = time.time() - val_start
        out.offer(agent, start_val, 0, {"iteration": 0})
        history.append({"iteration": 0, "val_unallocated": start_val, "elapsed_s": time.time() - start_time})

    pool = None
    workers = args.workers or default_jobs()
    if workers > 1:
        pool = multiprocessing.get_context("fork").Pool(
            workers, initializer=set_worker_cores, initargs=(pickle.dumps(cores),)
        )
    else:
        set_worker_cores(pickle.dumps(cores))
    done_iterations = first_iteration - 1

    def steps_after(iteration: int) -> int:
        """Branch states collected by the end of ``iteration`` (what the run reports as its decisions)."""
        return iteration * args.vine_trunks * args.vine_points

    def checkpoint(iteration: int) -> None:
        write_checkpoint(
            out.dir / "checkpoint.pt",
            {
                "agent": agent.state_dict(),
                "optimizer": optimizer.state_dict(),
                "torch_rng": torch.get_rng_state(),
                "history": history,
                "best_val": out.best_val,
                "iteration": iteration,
                "elapsed": elapsed_before + time.time() - start_time,
                "args": asdict(args),
                "iteration_s": iteration_s,
                "validation_s": validation_s if validation_s is not None else validation_guess,
            },
        )

    try:
        for iteration in range(first_iteration, num_iterations + 1):
            elapsed = elapsed_before + time.time() - start_time
            reserve = iteration_s + (validation_s if validation_s is not None else validation_guess)
            if out_of_budget(args, iteration, first_iteration, elapsed, reserve):
                break
            it_start = time.time()
            set_lr(
                optimizer, (1.0 - (iteration - 1.0) / num_iterations if args.anneal_lr else 1.0) * args.learning_rate
            )

            # rollouts: trunks and their branches, in the workers (the numpy policy, as served)
            jobs = trunk_jobs(args, agent.to_arrays(), iteration, seed0)
            results = pool.map(trunk_job, jobs) if pool else [trunk_job(j) for j in jobs]
            points = [p for pts, _ in results for p in pts]
            rollout_s = time.time() - it_start
            batch = BranchBatch(points)

            # update: the clipped surrogate over (state, tried action) pairs
            moving = batch.advantage[batch.advantage != 0]
            adv_scale = float(moving.std()) if len(moving) > 1 and moving.std() > 0 else 1.0
            pairs = np.arange(len(batch))
            stats: dict[str, float] = {}
            for epoch in range(args.update_epochs):
                np.random.default_rng([args.seed, iteration, 1000 + epoch]).shuffle(pairs)
                # num_minibatches near-equal parts (none empty): no leftover sliver takes a full step
                for mb in np.array_split(pairs, min(args.num_minibatches, len(pairs))) if len(pairs) else []:
                    loss, stats = vine_loss(
                        agent,
                        batch,
                        mb,
                        args.clip_coef,
                        adv_scale,
                        args.ent_coef,
                        args.vf_coef,
                    )
                    optimizer.zero_grad()
                    loss.backward()
                    nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
                    optimizer.step()
                if args.target_kl is not None and stats.get("approx_kl", 0.0) > args.target_kl:
                    break

            # diagnostics, validation, checkpoint
            firsts = np.array([np.flatnonzero(batch.point_of == i)[0] for i in range(len(points))], dtype=np.int64)
            with torch.no_grad():
                values = agent(batch.ragged(firsts))[1].numpy()
            ev = explained_variance(values, batch.value_target)
            grad_norms = {
                f"grad_{name}": float(p.grad.norm())
                for name, p in agent.named_parameters()
                if p.grad is not None and name.endswith("weight")
            }
            row = {
                "iteration": iteration,
                "lr": optimizer.param_groups[0]["lr"],
                **stats,
                "explained_variance": ev,
                "epochs": epoch + 1,
                "points": len(points),
                "pairs": len(batch),
                "points_moving": sum(int(np.ptp(p.returns) > 0) for p in points),
                "adv_scale": adv_scale,
                "head_l1": agent.out.weight.detach().abs().sum().item(),
                **grad_norms,
                "episode_unallocated": float(np.mean([u for _, u in results])),
                "rollout_s": rollout_s,
                "iteration_s": time.time() - it_start,
                "elapsed_s": elapsed_before + time.time() - start_time,
                "val_unallocated": None,
            }
            last_iteration = iteration == num_iterations
            if (args.eval_every and iteration % args.eval_every == 0) or last_iteration:
                val_start = time.time()
                row["val_unallocated"] = float(
                    np.mean(validate_mode(numpy_net(agent, args), args, args.val_seeds, core))
                )
                validation_s = time.time() - val_start
                out.offer(agent, row["val_unallocated"], steps_after(iteration), {"iteration": iteration})
            elif validation_s is None:
                # not timed yet (--eval-every 0): each trunk job plays at least one whole episode, so one
                # episode takes at most the rollout's time over the rounds of jobs the workers ran
                rounds = math.ceil(len(jobs) / (workers if pool else 1))
                validation_guess = len(args.val_seeds) * rollout_s / max(rounds, 1)
            history.append(row)
            out.log(row)
            iteration_s = time.time() - it_start
            if args.progress:
                print(
                    f"[vine] it {iteration}/{num_iterations} trunk {row['episode_unallocated']:.3f} "
                    f"val {row['val_unallocated']} kl {row.get('approx_kl', 0):.4f} clip {row.get('clipfrac', 0):.3f} "
                    f"ev {ev:.2f} head {row['head_l1']:.2f} moving {row['points_moving']}/{len(points)} "
                    f"{row['iteration_s']:.0f}s",
                    file=sys.stderr,
                    flush=True,
                )
            if iteration % args.checkpoint_every == 0 or last_iteration:
                checkpoint(iteration)
            done_iterations = iteration
    finally:
        if pool is not None:
            pool.close()
            pool.join()

    # the end: validate and export the final policy; the checkpoint (also when --max-iterations or
    # --max-minutes stopped the loop between checkpoint_every) lets --resume go on from here
    val_start = time.time()
    final_val = float(np.mean(validate_mode(numpy_net(agent, args), args, args.val_seeds, core)))
    validation_s = time.time() - val_start
    seconds = elapsed_before + time.time() - start_time
    out.finish(agent, final_val, steps_after(done_iterations), {"iteration": done_iterations, "wallSeconds": seconds})
    checkpoint(done_iterations)
    return TrainResult(
        str(out.best_path),
        out.best_val,
        final_val,
        steps_after(done_iterations),
        seconds,
        str(out.dir),
        history,
    )
