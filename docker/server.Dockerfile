# rpsagg-server: the gRPC aggregation service and its dashboard (FastAPI under uvicorn).
# Build from the repository root:  docker build -f docker/server.Dockerfile -t rpsagg-server .
# Configuration: RPSAGG_<FLAG> environment variables (rpsagg-server --help), see
# docker-compose.yml and .env.example.

# --- build: a virtual environment with the library and the server ------------------------
ARG BASE_IMAGE=python:3.11.14-slim-bookworm
FROM ${BASE_IMAGE} AS build
# "[ray]" for the Ray decode backend and the compose file's ray profile (ray start); empty
# by default: the default server never needs Ray's ~70 MB
ARG SERVER_EXTRAS=""
ENV VIRTUAL_ENV=/opt/venv PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv "$VIRTUAL_ENV"
ENV PATH="/opt/venv/bin:$PATH"
WORKDIR /src
COPY common/ common/
COPY wire/ wire/
COPY server/ server/
RUN --mount=type=cache,target=/root/.cache/pip pip install "./common[fast]" ./wire "./server${SERVER_EXTRAS}"

# --- runtime: the venv and a non-root user ------------------------------------------------
FROM ${BASE_IMAGE}
# one uid and gid, 10001, named rpsagg (files in the data volume show as rpsagg:rpsagg)
RUN groupadd --system --gid 10001 rpsagg \
    && useradd --system --uid 10001 --gid rpsagg --home-dir /data --shell /usr/sbin/nologin rpsagg \
    && mkdir -p /data/cache && chown -R rpsagg:rpsagg /data
COPY --from=build /opt/venv /opt/venv
COPY docker/healthcheck.py /usr/local/bin/rpsagg-healthcheck
COPY docker/server-entrypoint.sh /usr/local/bin/rpsagg-entrypoint
ENV PATH="/opt/venv/bin:$PATH" PYTHONUNBUFFERED=1 \
    RPSAGG_HOST=0.0.0.0 RPSAGG_HTTP_HOST=0.0.0.0 RPSAGG_GRPC_PORT=50051 RPSAGG_HTTP_PORT=8000 \
    RPSAGG_DB=/data/rpsagg.db RPSAGG_CACHE_DIR=/data/cache
WORKDIR /data
USER 10001:10001
EXPOSE 50051 8000
HEALTHCHECK --interval=10s --timeout=5s --start-period=120s --retries=3 \
    CMD ["python", "/usr/local/bin/rpsagg-healthcheck", "http"]
# with --decode-backend ray the entrypoint first makes this container a zero-CPU Ray node
ENTRYPOINT ["/usr/local/bin/rpsagg-entrypoint"]
CMD ["rpsagg-server"]
