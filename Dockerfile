# One image for Berth's three components; the Deployment picks one with its
# first argument: `berth controller`, `berth webhook` or `berth extender`.
#
# The build stage installs the pinned dependencies and the project into a
# virtualenv without pip; the final stage is the slim base plus that
# virtualenv, so no build tooling or source tree ships.
#
# Everything the build fetches is pinned by content: the base image by digest,
# every dependency by the sha256 of its files (requirements-hashed.lock, with
# --require-hashes). The project's wheel is built offline with the base image's
# own setuptools, so no unpinned build dependency is downloaded either.
#
# The base image: python:3.11-slim (Python 3.11.16, Debian trixie, built
# 2026-08-13), the digest of its multi-platform index as the Docker Official
# Images publish it in github.com/docker-library/repo-info,
# repos/python/remote/3.11-slim.md. To move to a newer build, take the digest
# from that file, or from `docker buildx imagetools inspect python:3.11-slim`
# (the "Digest:" line), and replace it in both FROM lines.

FROM python:3.11-slim@sha256:a630a63cdb314e2d138a2fca3e375e319e8568346ffafac5b980f888630ac4f1 AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv --without-pip /opt/berth
WORKDIR /src
# Dependencies first, in their own layer: it is rebuilt only when the lock changes.
COPY requirements-hashed.lock .
RUN pip --python /opt/berth/bin/python install \
        --require-hashes --only-binary=:all: -r requirements-hashed.lock
COPY . .
RUN pip wheel --no-deps --no-build-isolation --wheel-dir /tmp/dist . \
    && pip --python /opt/berth/bin/python install --no-deps --no-index /tmp/dist/*.whl

FROM python:3.11-slim@sha256:a630a63cdb314e2d138a2fca3e375e319e8568346ffafac5b980f888630ac4f1
# The pods run with a read-only root filesystem: compiled bytecode is written
# at install time, never at run time.
ENV PATH=/opt/berth/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# No package installer at run time: the base image's pip, setuptools and wheel
# go, and with them ensurepip, which could bring pip back.
RUN python -m pip uninstall --yes --no-cache-dir pip setuptools wheel \
    && rm -rf /usr/local/bin/pip* /usr/local/lib/python3.11/ensurepip
COPY --from=build /opt/berth /opt/berth
# The conventional "nonroot" uid/gid; the Deployments' runAsUser matches it.
USER 65532:65532
ENTRYPOINT ["berth"]
