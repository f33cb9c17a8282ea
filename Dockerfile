# One slim image for both `rlsched extender` and `rlsched operator` (helm/rl-scheduler runs it).
# Serving is numpy-only: no torch, and none of the trainer's plotting/gym packages.
#
#   podman build -t localhost/rl-scheduler:0.1.0 .          # or: docker build ...
#   podman build --build-arg BASE=localhost/debian-python:bookworm ...   # no registry: docs/install.md
#
# BASE must provide python3 (3.11+) with venv and ensurepip: python:3.11-slim, or Debian bookworm with
# python3 and python3-venv.
ARG BASE=python:3.11-slim

# -- build: the wheel, then a virtual environment with the serving dependencies only ----------------
FROM ${BASE} AS build
# The title label on this stage too (every layer of it inherits it): hack/build-image.sh tags this stage
# localhost/rl-scheduler-build:cache and prunes, by this label, the build stages that lost that tag.
LABEL org.opencontainers.image.title="kube-rl-scheduler" \
      org.opencontainers.image.description="kube-rl-scheduler build stage (a build cache, not a runnable image)"
ARG TRAINING_ONLY="matplotlib gymnasium tqdm"
# Optional: a CA bundle for pip behind a TLS-intercepting proxy, and another package index
# (hack/build-image.sh passes the host's PIP_CERT through a build-time volume).
ARG PIP_CERT
ARG PIP_INDEX_URL
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore
WORKDIR /src
RUN python3 -m venv /opt/rlsched
COPY pyproject.toml README.md LICENSE ./
# The serving requirements: pyproject.toml's dependencies minus the training-only ones (the extender
# and the operator never import them; tests/unit/test_chart_sync.py checks both facts).
RUN /opt/rlsched/bin/python -c "import re, sys, tomllib; \
skip = set(sys.argv[1].split()); \
deps = tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']; \
keep = [d for d in deps if re.match(r'[A-Za-z0-9_.-]+', d).group(0).lower() not in skip]; \
open('/tmp/requirements.txt', 'w').write('\n'.join(keep) + '\n')" "${TRAINING_ONLY}" \
 && /opt/rlsched/bin/pip install --requirement /tmp/requirements.txt
COPY rlsched rlsched
COPY policy policy
COPY extender extender
COPY operator operator
# Then trim what serving never loads: pip/setuptools, the test suites of numpy/numba/llvmlite, and
# the kubernetes client's asyncio twin (kubernetes/aio, ~70 MB; the operator uses the sync client).
# /opt/rlsched/models points at the models shipped as package data (the chart's default modelPath).
RUN /opt/rlsched/bin/pip wheel --no-deps --wheel-dir /wheels . \
 && /opt/rlsched/bin/pip install --no-deps /wheels/kube_rl_scheduler-*.whl \
 && /opt/rlsched/bin/pip uninstall --yes pip setuptools \
 && site="$(/opt/rlsched/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
 && rm -rf "${site}/kubernetes/aio" "${site}/numba/tests" "${site}/llvmlite/tests" "${site}/numpy/tests" "${site}"/numpy/*/tests \
 && ln -s "${site}/rlsched/policy/models" /opt/rlsched/models \
 && /opt/rlsched/bin/python -I -c "import rlsched.extender.server, rlsched.operator.handlers, kubernetes.client"

# -- runtime ------------------------------------------------------------------------------------------
FROM ${BASE}
LABEL org.opencontainers.image.title="kube-rl-scheduler" \
      org.opencontainers.image.description="rlsched extender (kube-scheduler extender) and rlsched operator; numpy-only serving" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN groupadd --gid 65532 rlsched \
 && useradd --uid 65532 --gid 65532 --home-dir /nonexistent --no-create-home --shell /usr/sbin/nologin rlsched
COPY --from=build /opt/rlsched /opt/rlsched
# NUMBA_CACHE_DIR: numba caches compiled kernels next to the package by default, which is read-only
# here (mount an emptyDir at /tmp with a read-only root filesystem). One BLAS thread: docs/extender.md.
ENV PATH=/opt/rlsched/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    NUMBA_CACHE_DIR=/tmp/numba-cache \
    OPENBLAS_NUM_THREADS=1 \
    OMP_NUM_THREADS=1 \
    HOME=/tmp
USER 65532:65532
WORKDIR /tmp
# 8888: extender verbs (loopback); 8889: extender status/metrics; 8080: operator liveness.
EXPOSE 8889 8080
ENTRYPOINT ["rlsched"]
CMD ["--help"]
