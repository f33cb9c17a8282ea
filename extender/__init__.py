"""rlsched.extender — the kube-scheduler extender (docs/extender.md, docs/gpu-sharing.md).

The public surface is re-exported lazily (``rlsched --help`` must not import aiohttp or numpy):

- :func:`make_app`, :func:`make_status_app` — the aiohttp applications (verbs; status);
- :class:`Extender` — the four verbs over a :class:`ClusterCache` and a :class:`PolicyEngine`;
- :class:`ExtenderSettings`, :func:`load_settings` — settings; :func:`serve` — run it all;
- :func:`scheduler_config`, :func:`render_scheduler_config` — the recommended KubeSchedulerConfiguration.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "make_app": "app",
    "make_status_app": "app",
    "Health": "app",
    "Extender": "verbs",
    "ClusterCache": "cache",
    "PolicyEngine": "policy",
    "Verdict": "policy",
    "Binder": "binder",
    "DecisionRing": "decisions",
    "Metrics": "metrics",
    "LoadPoller": "prometheus",
    "KubeApi": "kubeapi",
    "ExtenderSettings": "settings",
    "load_settings": "settings",
    "ConfigError": "settings",
    "GpuConventions": "settings",
    "serve": "server",
    "StartupError": "server",
    "scheduler_config": "scheduler_config",
    "render_scheduler_config": "scheduler_config",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'rlsched.extender' has no attribute {name!r}")
    attr = "render" if name == "render_scheduler_config" else name
    return getattr(importlib.import_module(f"{__name__}.{module}"), attr)
