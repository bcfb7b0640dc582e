# The sandbox image. Built by `orchestrator build-image`, which also makes the
# wheelhouse and (where no registry is reachable) the local base image, and builds with
# `--network none`:
#
#   docker build --network none --build-arg BASE_IMAGE=<base> -t sandbox-orchestrator/sandbox .
#
# The build context is the repository root; .dockerignore lets only .wheelhouse/ and the
# entrypoint in. The agent's code is not in the image: it is mounted read-only from the host.
ARG BASE_IMAGE=python:3.11-slim

# Stage 1: a virtualenv with the agent's dependencies, installed from the wheelhouse only.
# pip itself runs from its wheel, so the base needs no pip (Debian's python3 has none).
FROM ${BASE_IMAGE} AS install
COPY .wheelhouse/ /wheelhouse/
RUN python3 -m venv --without-pip /opt/sandbox/venv \
 && /opt/sandbox/venv/bin/python "$(ls /wheelhouse/pip-*.whl)/pip" install \
      --no-index --find-links /wheelhouse --no-cache-dir --disable-pip-version-check \
      --only-binary=:all: -r /wheelhouse/requirements.txt \
 && /opt/sandbox/venv/bin/python -c "import starlette, uvicorn, httptools, pydantic, psutil, regex" \
 && python3 "$(ls /wheelhouse/pip-*.whl)/pip" install --no-index --find-links /wheelhouse --no-cache-dir \
      --disable-pip-version-check --break-system-packages --no-warn-script-location --only-binary=:all: \
      --root /opt/pip-root pip -r /wheelhouse/workbench.txt

# Stage 2: the base plus that virtualenv; no wheelhouse layer left behind.
FROM ${BASE_IMAGE}
ARG RECIPE=unknown
# A digest of the agent's pinned dependencies: the orchestrator refuses an image whose digest
# differs from its own (orchestrator/sandboxes/image/compat.py).
ARG AGENT_LOCK=unknown
COPY --from=install /opt/sandbox/venv /opt/sandbox/venv
# pip for the system python, so skills can install their Python CLIs into deps/{uid}/ through
# the egress proxy (docs/egress.md); the agent's shells point it at the proxy and the host's
# CA bundle, which the docker backend mounts read-only. With it, the user's python packages of
# the workbench (images/workbench-requirements.txt: numpy, pandas, matplotlib, pillow, requests,
# ipykernel, ...), apart from the agent's virtualenv above, which sees none of them.
COPY --from=install /opt/pip-root/usr/local/ /usr/local/
COPY images/sandbox-entrypoint /usr/local/bin/sandbox-entrypoint
# An unprivileged default user; the orchestrator runs each user's sandbox as that user's own
# uid (base + user id) instead, which needs no passwd entry.
RUN useradd --system --uid 999 --user-group --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin sandbox
# No setuid/setgid programs (su, passwd, mount, ...): a sandbox that finds a bug in one must not
# gain another uid or group. tests/orchestrator/sandboxes/docker/test_image_hardening.py checks none is left.
RUN find / -xdev -type f -perm /6000 -exec chmod a-s {} + \
 && test -z "$(find / -xdev -type f -perm /6000 -print -quit)"
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 LANG=C.UTF-8
LABEL org.sandbox-orchestrator.role=sandbox org.sandbox-orchestrator.recipe=${RECIPE} \
      org.sandbox-orchestrator.agent-lock=${AGENT_LOCK}
USER sandbox
ENTRYPOINT ["/usr/local/bin/sandbox-entrypoint"]
