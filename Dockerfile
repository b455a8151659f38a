# syntax=docker/dockerfile:1
# The gpu-remediate worker image (also runs the CLI and the simulators).
#
#   docker build -t gpu-remediate:0.1.0 .
#
# Stage 1 builds the project wheel and installs it with its pinned dependencies
# (constraints.txt, generated from the lock) into a virtual environment. Stage 2 is
# the slim runtime: the venv only, no compilers, no pip, a non-root user.

ARG PYTHON_IMAGE=python:3.11.13-slim-bookworm

FROM ${PYTHON_IMAGE} AS builder

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1

WORKDIR /src

# The venv has no pip of its own: the base image's pip installs into it, so no
# installer is copied into the runtime image.
RUN python -m venv --without-pip /opt/venv

# Dependencies first, from pyproject's list pinned by the lock's constraints, so a
# source change does not reinstall them.
COPY pyproject.toml constraints.txt ./
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" > /tmp/requirements.txt \
 && python -m pip --python /opt/venv/bin/python install --no-compile \
        --requirement /tmp/requirements.txt --constraint constraints.txt

COPY README.md ./
COPY policy/ policy/
COPY activities/ activities/
COPY workflows/ workflows/
COPY worker/ worker/
COPY sim/ sim/
RUN python -m pip wheel --no-deps --wheel-dir /wheels . \
 && python -m pip --python /opt/venv/bin/python install --no-deps --no-compile /wheels/*.whl \
 && /opt/venv/bin/python -m compileall -q /opt/venv/lib

FROM ${PYTHON_IMAGE}

ARG VERSION=0.1.0
ARG REVISION=unknown
ARG CREATED=unknown

LABEL org.opencontainers.image.title="gpu-remediate" \
      org.opencontainers.image.description="Detects sick Kubernetes GPU nodes from DCGM metrics and remediates each one as a durable Temporal workflow." \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.documentation="docs/install.md"

# pip, setuptools and wheel are installers: the runtime needs none of them.
RUN python -m pip uninstall --yes --quiet pip setuptools wheel \
 && groupadd --system --gid 10001 gpu-remediate \
 && useradd --system --uid 10001 --gid 10001 --no-create-home \
        --home-dir /nonexistent --shell /usr/sbin/nologin gpu-remediate

COPY --from=builder /opt/venv /opt/venv

ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1

USER 10001:10001
WORKDIR /tmp

# 8080 /healthz and /readyz, 9464 service metrics, 9465 Temporal SDK metrics.
EXPOSE 8080 9464 9465

# slim has no curl: ask the liveness endpoint with the interpreter itself.
HEALTHCHECK --interval=15s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/healthz', timeout=4)"]

ENTRYPOINT ["gpu-remediate"]
CMD ["worker", "--config", "/etc/gpu-remediate/config.yaml"]
