# The MBN embedding service. `mbn serve` by default; `mbn worker` for stand-alone training workers
# (docker/compose.yml runs both).
#
#   docker build -t mbn .
#   docker run -p 8000:8000 -v mbn-data:/data mbn
#
# Settings are MBN_* environment variables (README: configuration); MBN_PORT and MBN_WORKERS
# pick the port and the number of server processes.

# ---- builder: a virtual environment with every dependency, and the wheel of this project ----
FROM python:3.11-slim-bookworm AS builder

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1
WORKDIR /src

# Dependencies first, read from pyproject.toml (the library's and the service extra's): this
# layer stays cached while only code changes. Every dependency ships manylinux wheels, so no
# compiler is needed here either.
COPY pyproject.toml ./
# The image also carries the 'distributed' extra (Dask, Zarr): compose runs it as the Dask
# scheduler and workers, and training jobs use them.
RUN python -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; print(*p['dependencies'], *p['optional-dependencies']['service'], *p['optional-dependencies']['distributed'], sep='\n')" > requirements.txt \
    && python -m venv /opt/venv \
    && /opt/venv/bin/pip install --no-cache-dir -r requirements.txt

COPY . ./
RUN /opt/venv/bin/pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

# ---- runtime: the environment, a non-root user, nothing to build with ----
FROM python:3.11-slim-bookworm

LABEL org.opencontainers.image.title="mbn" \
      org.opencontainers.image.description="Multilayer Bootstrap Network embedding service"

RUN groupadd --gid 10001 mbn \
    && useradd --uid 10001 --gid mbn --no-log-init --create-home --home-dir /home/mbn \
        --shell /usr/sbin/nologin mbn \
    && mkdir -p /data /var/cache/mbn/numba \
    && chown mbn:mbn /data /var/cache/mbn/numba

# The dependencies, then this project's wheel: a code change only redoes the last, small layers.
# The wheel is copied, not bind-mounted: podman reuses a RUN layer whatever a bind mount holds,
# so a mounted wheel left the image on the code of its first build.
COPY --from=builder /opt/venv /opt/venv
COPY --from=builder /wheels /tmp/wheels
RUN /opt/venv/bin/pip install --no-cache-dir --no-deps /tmp/wheels/*.whl \
    && rm -rf /tmp/wheels

# numba compiles the hot loops on first use and caches them (cache=True); site-packages is not
# writable for the service's user, so the cache goes to a directory that is.
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    NUMBA_CACHE_DIR=/var/cache/mbn/numba \
    MBN_DATA_DIR=/data \
    MBN_HOST=0.0.0.0 \
    MBN_PORT=8000 \
    MBN_WORKERS=1

VOLUME ["/data"]
WORKDIR /home/mbn
USER 10001:10001
EXPOSE 8000

# Liveness only: /health/ready stays 503 while the first (demo) model trains, which is no reason
# to restart the container.
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:' + os.environ['MBN_PORT'] + '/health/live', timeout=4)"]

# exec: mbn becomes PID 1 and receives SIGTERM itself (graceful shutdown).
CMD ["sh", "-c", "exec mbn serve --host \"$MBN_HOST\" --port \"$MBN_PORT\" --workers \"$MBN_WORKERS\""]
