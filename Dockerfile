# One image for Berth's three components; the Deployment picks one with its
# first argument: `berth controller`, `berth webhook` or `berth extender`.
#
# The build stage installs the pinned dependencies and the project into a
# virtualenv without pip; the final stage is the slim base plus that
# virtualenv, so no build tooling or source tree ships.

FROM python:3.11-slim AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv --without-pip /opt/berth
WORKDIR /src
# Dependencies first, in their own layer: it is rebuilt only when the lock changes.
COPY requirements.lock .
RUN pip --python /opt/berth/bin/python install \
        --only-binary=:all: -r requirements.lock
COPY . .
RUN pip --python /opt/berth/bin/python install --no-deps .

FROM python:3.11-slim
# The pods run with a read-only root filesystem: compiled bytecode is written
# at install time, never at run time.
ENV PATH=/opt/berth/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
COPY --from=build /opt/berth /opt/berth
# The conventional "nonroot" uid/gid; the Deployments' runAsUser matches it.
USER 65532:65532
ENTRYPOINT ["berth"]
