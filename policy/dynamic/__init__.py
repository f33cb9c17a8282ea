"""A living cluster: pods arrive and depart, use what they use, and nodes cost money.

The FGD protocol (``rlsched.policy.simulator``) fills an empty cluster once and never frees
anything, so load, cost, waiting and departures carry no signal there. This package is the other
mode: a seeded arrival process over the openb trace's own pods and lifetimes, per-pod usage drawn
from published utilization measurements, Prometheus-like sampling of node load into
``ClusterState.load``, node prices per GPU model, and the measures a platform team watches
(allocation, stranded GPUs, queueing delay, SLA violations, cost, rejections).
"""
