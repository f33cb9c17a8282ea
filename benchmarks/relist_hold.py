"""How long a relist holds the extender's event loop: the longest stretch in which no request is served.

    python benchmarks/relist_hold.py [--nodes 1000] [--pods 4000] [--page 500] [--rounds 3]
                                     [--json out.json]

A relist (at start, after a 410 Gone or a broken watch) reads the list page by page, as
``KubeApi.list`` does (``limit=500``; each page's JSON is parsed on the event loop when it
arrives), and then applies it to the cache. Here the pages are prepared as JSON bytes and parsed
with ``orjson`` one at a time, the loop free between two pages (where the real client awaits the
next HTTP answer); the list is then applied through the real ``Informer.sync`` and ``ClusterCache``
in one of three ways (``HOWS``): in one step (``replace_nodes``/``replace_pods``, and the list freed
at once: the informer before 2026-11-28), in slices of ``RELIST_SLICE`` objects (``Informer.sync``
with ``replace_*_in_slices``, the list freed ``FREE_SLICE`` objects at a time), or so with the garbage
collector paused while the list is read and applied (``GcPause``: what the extender runs).
A ticker task measures the longest gap between two of its turns on the loop: the longest a filter,
prioritize or bind would have waited.

Three lists, each timed for nodes and pods together: the first list into an empty cache, a relist
that changes nothing, and a relist in which every pod changed (a new resourceVersion and a label).
The objects are the test builders' (``rlsched.extender.testing``: ~4.8 KB per node and ~4 KB per pod
as JSON, about what a kwok node and a small pod weigh); half the pods take a whole card, half a share.
Prints one line per case and round, and the median of the rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from rlsched.extender.cache import ClusterCache
from rlsched.extender.gc_pause import GcPause
from rlsched.extender.kubeapi import Informer
from rlsched.extender.settings import GpuConventions, KubeSettings
from rlsched.extender.testing import make_node, make_pod


class PagedApi:
    """``list`` from prepared JSON pages: one ``orjson.loads`` per page on the loop, a free turn of
    the loop between pages (the real client waits for the next answer there)."""

    def __init__(self, pages: list[bytes]):
        self.pages = pages

    async def list(self, path: str, timeout: float = 60.0, limit: int = 500) -> tuple[list[Any], str]:
        items: list[Any] = []
        for page in self.pages:
            await asyncio.sleep(0)
            items.extend(orjson.loads(page)["items"])
        return items, "1"


HOWS = ("one step", "slices", "slices, gc paused")
"""How the list is applied: all at once (before 2026-11-28), in slices, in slices with the garbage
collector paused (:class:`rlsched.extender.gc_pause.GcPause`: what the extender runs)."""


def pages_of(objects: list[dict[str, Any]], size: int) -> list[bytes]:
    return [orjson.dumps({"items": objects[i : i + size]}) for i in range(0, len(objects), size)]


async def longest_hold(run: Callable[[], Any]) -> tuple[float, float]:
    """(longest gap between two turns of a ticker, total wall) in ms while ``run()`` is awaited."""
    gaps = [0.0]
    done = False

    async def ticker() -> None:
        last = time.perf_counter()
        while not done:
            await asyncio.sleep(0)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    task = asyncio.ensure_future(ticker())
    await asyncio.sleep(0)
    start = time.perf_counter()
    await run()
    wall = time.perf_counter() - start
    done = True
    await task
    return max(gaps) * 1e3, wall * 1e3


async def relist(
    cache: ClusterCache, nodes: list[bytes], pods: list[bytes], how: str, gc_pause: GcPause
) -> tuple[float, float]:
    if how == HOWS[0]:  # the informer before 2026-11-28: list, apply, let the list go — each in one step
        lists: list[tuple[PagedApi, Callable[[list[Any]], None]]] = [
            (PagedApi(nodes), cache.replace_nodes),
            (PagedApi(pods), cache.replace_pods),
        ]

        async def before() -> None:
            for api, replace in lists:
                items, _ = await api.list("")
                replace(items)
                del items

        return await longest_hold(before)
    pause = gc_pause if how == HOWS[2] else None
    informers = [
        Informer(api, kind, path, replace, lambda k, o: None, KubeSettings(), gc_pause=pause)
        for api, kind, path, replace in (
            (PagedApi(nodes), "nodes", "/api/v1/nodes", cache.replace_nodes_in_slices),
            (PagedApi(pods), "pods", "/api/v1/pods", cache.replace_pods_in_slices),
        )
    ]

    async def both() -> None:
        for informer in informers:
            await informer.sync()

    return await longest_hold(both)


def workload(n_nodes: int, n_pods: int, changed: bool) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    nodes = [make_node(f"node-{i:05d}", gpus=8) for i in range(n_nodes)]
    rv = "3000" if changed else "2000"
    pods = [
        make_pod(
            f"pod-{j:06d}",
            gpus=1 if j % 2 else 0,
            gpu_milli=0 if j % 2 else 500,
            node=f"node-{j % n_nodes:05d}",
            uid=f"uid-{j:06d}",
            rv=rv,
        )
        for j in range(n_pods)
    ]
    if changed:
        for pod in pods:
            pod["metadata"].setdefault("labels", {})["relisted"] = "yes"
    return nodes, pods


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--pods", type=int, default=4000)
    ap.add_argument("--page", type=int, default=500, help="objects per list page (KubeApi.list's limit)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", type=Path, help="write the rounds and medians here")
    args = ap.parse_args(argv)
    if args.nodes < 1 or args.pods < 0 or args.page < 1 or args.rounds < 1:
        ap.error("--nodes, --page and --rounds must be at least 1, --pods at least 0")

    # Only the JSON bytes are kept: the extender holds no raw objects besides the list being applied,
    # and every object alive is one more for the garbage collector to walk.
    nodes, pods = workload(args.nodes, args.pods, changed=False)
    node_pages, pod_pages = pages_of(nodes, args.page), pages_of(pods, args.page)
    changed_pages = pages_of(workload(args.nodes, args.pods, changed=True)[1], args.page)
    del nodes, pods
    gc.collect()
    page_kb = max(len(p) for p in node_pages + pod_pages) / 1024
    print(f"{args.nodes} nodes, {args.pods} pods, pages of {args.page} (largest {page_kb:.0f} KiB)")

    rows: list[dict[str, Any]] = []
    gc_pause = GcPause()
    for r in range(args.rounds):  # the ways interleaved, so that a change in the host's speed hits all
        for how in HOWS:
            cache = ClusterCache(GpuConventions())
            cases = {
                "first list": asyncio.run(relist(cache, node_pages, pod_pages, how, gc_pause)),
                "relist, nothing changed": asyncio.run(relist(cache, node_pages, pod_pages, how, gc_pause)),
                "relist, every pod changed": asyncio.run(relist(cache, node_pages, changed_pages, how, gc_pause)),
            }
            for case, (hold, wall) in cases.items():
                rows.append({"apply": how, "case": case, "round": r, "longestHoldMs": hold, "wallMs": wall})
                print(f"{how:17} round {r}  {case:27} longest hold {hold:7.1f} ms  (whole list {wall:7.1f} ms)")

    def median_of(how: str, case: str, key: str) -> float:
        return statistics.median(x[key] for x in rows if (x["apply"], x["case"]) == (how, case))

    medians = [
        {
            "apply": how,
            "case": case,
            "longestHoldMs": median_of(how, case, "longestHoldMs"),
            "wallMs": median_of(how, case, "wallMs"),
        }
        for how in HOWS
        for case in ("first list", "relist, nothing changed", "relist, every pod changed")
    ]
    print("\nmedians of the rounds:")
    for m in medians:
        hold, wall = m["longestHoldMs"], m["wallMs"]
        print(f"{m['apply']:17} {m['case']:27} longest hold {hold:7.1f} ms  (whole list {wall:7.1f} ms)")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        out = {"args": vars(args) | {"json": str(args.json)}, "rounds": rows, "medians": medians}
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
