# holdwarden: the enforcer (`holdwarden serve`) and the operator CLI, in one image.
#   docker build -t holdwarden:0.1.0 .
# Stage 1 builds the project's wheel; stage 2 installs the dependencies pinned with hashes
# in requirements.lock (pip --require-hashes: nothing is resolved afresh) and the wheel,
# with no compiler, no pip cache and no source tree, and runs as a non-root user. The
# wheel holds only the runtime parts: no tests, no local control plane, no demo.

FROM python:3.11-slim AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
# holdwarden/adapter, webhook, readmission and certs are symlinks to the folders of the same
# names beside holdwarden/ (COPY keeps a symlink inside a folder as a symlink); the wheel
# gets the files under holdwarden/ (docs/explanation/layout.md).
COPY adapter/ adapter/
COPY webhook/ webhook/
COPY readmission/ readmission/
COPY certs/ certs/
COPY holdwarden/ holdwarden/
RUN pip wheel --no-deps --wheel-dir /wheels .

FROM python:3.11-slim
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
# glibc's malloc: serve allocations under 4 MiB from the heap, and keep up to 64 MiB of
# freed heap before giving it back. Its default (a threshold that moves with each free, and
# trimming above twice it) made every 1.5 MB review map and fault in ~3 MB of fresh pages
# (~750 page faults), half its CPU cost and most of its run-to-run spread
# (docs/performance/large-reviews.md). The peak is bounded as before; what changes is that
# up to 64 MiB of it stays mapped after a burst.
ENV MALLOC_MMAP_THRESHOLD_=4194304 MALLOC_TRIM_THRESHOLD_=67108864
# The dependencies in a layer of their own, before the project's code: a change to the code
# (or a new revision) rebuilds only the small layer below, and nodes pull only that.
COPY requirements.lock /tmp/requirements.lock
RUN pip install --require-hashes --no-deps -r /tmp/requirements.lock \
 && rm /tmp/requirements.lock
# COPY, not RUN --mount=from=build: buildah does not mount a build stage it took from its
# layer cache. The wheel (~0.2 MB) stays in this layer.
COPY --from=build /wheels/ /tmp/wheels/
RUN pip install --no-deps --no-index /tmp/wheels/holdwarden-*.whl \
 && rm -r /tmp/wheels \
 && groupadd --gid 65532 holdwarden \
 && useradd --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin holdwarden \
 && mkdir -p /etc/holdwarden/tls /var/log/holdwarden \
 && chown 65532:65532 /var/log/holdwarden
# Last, so that a new revision changes the image's metadata only.
ARG VERSION=0.1.0
ARG REVISION=unknown
LABEL org.opencontainers.image.title="holdwarden" \
      org.opencontainers.image.description="Instance-numbered holds for Kubeflow Trainer TrainJobs: admission enforcer, readmission gate and operator CLI" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.licenses="Apache-2.0"
# Numeric, so that Kubernetes can check runAsNonRoot against the image.
USER 65532:65532
EXPOSE 9443 9090
ENTRYPOINT ["holdwarden"]
CMD ["serve", "--config", "/etc/holdwarden/config.yaml"]
