# rpsagg-client: joins a server, runs its task on this client's data shard until the job is
# done. No FastAPI/uvicorn: only the library (rpsagg) and the client. Fashion-MNIST for the
# demo task comes from Debian's dataset-fashion-mnist package (/usr/share/datasets).
# Build from the repository root:  docker build -f docker/client.Dockerfile -t rpsagg-client .

# --- build: a virtual environment with the library and the client ------------------------
ARG BASE_IMAGE=python:3.11.14-slim-bookworm
FROM ${BASE_IMAGE} AS build
ENV VIRTUAL_ENV=/opt/venv PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv "$VIRTUAL_ENV"
ENV PATH="/opt/venv/bin:$PATH"
WORKDIR /src
COPY common/ common/
COPY wire/ wire/
COPY client/ client/
RUN --mount=type=cache,target=/root/.cache/pip pip install "./common[fast]" ./wire ./client

# --- runtime: the venv, the demo data and a non-root user ---------------------------------
FROM ${BASE_IMAGE}
RUN apt-get update \
    && apt-get install -y --no-install-recommends dataset-fashion-mnist=0.0~git20200523.55506a9-1 \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 rpsagg \
    && useradd --system --uid 10001 --gid rpsagg --create-home --shell /usr/sbin/nologin rpsagg
COPY --from=build /opt/venv /opt/venv
COPY docker/healthcheck.py /usr/local/bin/rpsagg-healthcheck
ENV PATH="/opt/venv/bin:$PATH" PYTHONUNBUFFERED=1 RPSAGG_SERVER=server:50051
WORKDIR /home/rpsagg
USER 10001:10001
HEALTHCHECK --interval=30s --timeout=5s --start-period=10s --retries=3 \
    CMD ["python", "/usr/local/bin/rpsagg-healthcheck", "tcp"]
CMD ["rpsagg-client"]
