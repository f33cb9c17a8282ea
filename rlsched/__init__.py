"""kube-rl-scheduler: a Kubernetes scheduler extender and operator that places pods with a learned policy.

Sub-packages: :mod:`rlsched.policy` (domain model, simulator, scorers, the learned policy),
:mod:`rlsched.extender` (the kube-scheduler extender), :mod:`rlsched.operator` (the kopf operator).
"""

__version__ = "0.1.0"
