"""rlsched.operator — the kopf operator of kube-rl-scheduler (docs/operator.md).

- :mod:`.spec` — the SchedulingPolicy CRD (``crds/``) and the spec's validation.
- :mod:`.sink` — where policy files and models are published (ConfigMap in a cluster, a folder locally).
- :mod:`.rollout` — publish, verify against the extender's ``/status``, roll back.
- :mod:`.requeue` — requeue of pods the policy delayed; events/conditions for rejected ones.
- :mod:`.decisionlog` — the append-only decision dataset (read by :mod:`rlsched.policy.decision_dataset`).
- :mod:`.handlers` — the kopf handlers (:func:`~.handlers.build_registry`); :mod:`.cli` — ``rlsched operator``.
"""
