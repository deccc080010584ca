# nodeguard's image: the agent in a virtual environment on Debian's slim Python image.
#   docker build -t registry.example.com/nodeguard:0.1.0 .
# Every dependency installs from a binary wheel (amd64 and arm64), so neither stage needs a
# compiler, and the final image has none (python:*-slim ships no gcc).
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY nodeguard ./nodeguard
# nodeguard itself is pure Python: a wheel from the source, then everything from wheels only.
# The installer itself is not needed at run time: pip and setuptools leave the environment.
RUN pip wheel --no-deps --wheel-dir /wheels . \
 && python -m venv /opt/nodeguard \
 && /opt/nodeguard/bin/pip install --only-binary=:all: /wheels/nodeguard-*.whl \
 && /opt/nodeguard/bin/python -m pip uninstall --yes pip setuptools \
 && /opt/nodeguard/bin/nodeguard --version

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="nodeguard" \
      org.opencontainers.image.description="Node memory exporter and remediation agent for Kubernetes GPU nodes" \
      org.opencontainers.image.licenses="Apache-2.0"
# The same base image, so the environment's interpreter links stay valid.
COPY --from=build /opt/nodeguard /opt/nodeguard
ENV PATH=/opt/nodeguard/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# Non-root by default: `nodeguard snapshot` and a metrics-only `nodeguard run` read only
# world-readable files. The DaemonSet runs it as root (securityContext there says why: the
# kernel log and the root-owned state directory on the host), with every capability dropped
# but SYSLOG and a read-only root filesystem.
USER 65534:65534
EXPOSE 9847
ENTRYPOINT ["nodeguard"]
CMD ["run"]
