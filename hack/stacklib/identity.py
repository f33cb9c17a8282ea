"""Who may read the extender's status listener: ServiceAccounts bound to a ClusterRole on its non-resource
URLs, and their tokens from the TokenRequest API."""

from __future__ import annotations

import os
from pathlib import Path

from .cluster import LocalCluster

READER_ROLE = "rlsched-extender-reader"
"""ClusterRole: ``get`` on the extender's /status, /decisions and /metrics (non-resource URLs, which the
extender checks with a SubjectAccessReview)."""
STACK_IDENTITY = "rlsched-stack"
"""ServiceAccount of this harness's own reads (``Extender.status()`` …) and of the demo."""
OPERATOR_IDENTITY = "rlsched-operator"
"""ServiceAccount whose token the local operator sends to the extender."""
EXTENDER_AUDIENCE = "rlsched-extender"
"""The token audience the local extender accepts besides the API server's (``auth.audiences``), as the
chart's ``extender.auth.audience``: the local operator's token is made for it, so the API server
itself refuses that token (docs/security.md, "Audience-bound tokens")."""
IDENTITY_NAMESPACE = "kube-system"
TOKEN_DURATION = "720h"
"""How long a token of the local stack is valid (30 days; the local API server sets no maximum). ``Stack.up``
(``hack/rlstack.py up``, so every ``hack/demo.sh``) renews the tokens of the processes it keeps, whose
readers take the new file (the operator's ``--extender-token-file`` and ``Extender.token`` read it again)."""


def reader_rbac(account: str, namespace: str = IDENTITY_NAMESPACE, grant: bool = True) -> list[dict]:
    """The ServiceAccount ``account`` and, with ``grant``, a binding to :data:`READER_ROLE`."""
    objs: list[dict] = [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": account, "namespace": namespace}}
    ]
    if grant:
        objs += [
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRole",
                "metadata": {"name": READER_ROLE},
                "rules": [{"nonResourceURLs": ["/status", "/decisions", "/metrics"], "verbs": ["get"]}],
            },
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRoleBinding",
                "metadata": {"name": f"{READER_ROLE}-{account}"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": READER_ROLE},
                "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}],
            },
        ]
    return objs


def service_account_token(
    cluster: LocalCluster,
    account: str,
    grant: bool = True,
    namespace: str = IDENTITY_NAMESPACE,
    duration: str = TOKEN_DURATION,
    audience: str | None = None,
) -> Path:
    """Create the ServiceAccount (bound to :data:`READER_ROLE` with ``grant``), request a token for it
    (TokenRequest API; for ``audience`` when given, else the API server's) and write it to
    ``<state>/rlstack/tokens/<account>.token`` (mode 0600)."""
    cluster.apply(reader_rbac(account, namespace, grant))
    audience_args = ("--audience", audience) if audience else ()
    token = cluster.kubectl(
        "create", "token", account, "-n", namespace, "--duration", duration, *audience_args
    ).stdout.strip()
    folder = cluster.stack_dir / "tokens"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{account}.token"
    tmp = folder / f".{account}.token.tmp"
    tmp.unlink(missing_ok=True)  # a leftover of an interrupted write, maybe with other permissions
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # never readable by others, not even briefly
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    tmp.replace(path)  # atomic, like the kubelet's rotation: a reader sees the old token or the new one
    return path
