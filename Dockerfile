# syntax=docker/dockerfile:1
# holdwarden: the enforcer (`holdwarden serve`) and the operator CLI, in one image.
#   docker build -t holdwarden:0.1.0 .
# Stage 1 builds wheels for the project and its dependencies; stage 2 installs them
# with no compiler, no pip cache and no source tree, and runs as a non-root user.

FROM python:3.11-slim AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY adapter/ adapter/
COPY webhook/ webhook/
COPY certs/ certs/
COPY holdwarden/ holdwarden/
RUN pip wheel --wheel-dir /wheels .

FROM python:3.11-slim
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-index --find-links /wheels holdwarden \
 && groupadd --gid 65532 holdwarden \
 && useradd --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin holdwarden \
 && mkdir -p /etc/holdwarden/tls /var/log/holdwarden \
 && chown 65532:65532 /var/log/holdwarden
# Numeric, so that Kubernetes can check runAsNonRoot against the image.
USER 65532:65532
EXPOSE 9443 9090
ENTRYPOINT ["holdwarden"]
CMD ["serve", "--config", "/etc/holdwarden/config.yaml"]
