# One image for both components: `localcache controller` (Deployment) and `localcache agent`
# (DaemonSet); `localcache download` also works as a download-Job container for file:// and
# http(s):// URIs; `localcache import prepare|progress|place` are the steps of a shared-volume
# cache's import pod (run as the pod's uid, which need not be 65532: nothing is written outside
# the claim and stdout).
#
#   docker build -t localcache:dev .
#
# The final stage holds only the virtualenv with the wheel and its pinned dependencies. It runs
# as uid/gid 65532 and writes nothing outside /tmp, so it runs with readOnlyRootFilesystem and an
# emptyDir at /tmp (bytecode is compiled at build time; HOME points at /tmp).
ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS builder
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
COPY pyproject.toml constraints.txt README.md ./
COPY localcache ./localcache
# The same recipe as hack/build-images.sh (the image built without Docker): venv at
# /opt/localcache, the wheel, its dependencies pinned by constraints.txt, compileall, --help.
COPY hack/install-localcache.sh ./hack/install-localcache.sh
RUN sh hack/install-localcache.sh /src

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="localcache" \
      org.opencontainers.image.description="Pre-downloads ML models onto node-local disks for KServe" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PATH=/opt/localcache/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HOME=/tmp \
    TMPDIR=/tmp
COPY --from=builder /opt/localcache /opt/localcache
USER 65532:65532
WORKDIR /tmp
ENTRYPOINT ["localcache"]
CMD ["--help"]
