# The dispatcher's image, for those with a container engine:
#   docker build -t registry.example.com/dispatcher:0.1.0 .
# Generated from localcluster/image.py by `python -m localcluster image --dockerfile`:
# edit that, not this. `make image` builds the same image with no engine.
#
# debian:bookworm-slim with Debian's python3; the package and its dependencies installed
# from wheels into a venv at /opt/dispatcher, byte-compiled; a non-root user. Nothing is
# written at run time: the pod runs with a read-only root filesystem.
FROM debian:bookworm-slim AS build
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 ca-certificates python3-pip \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml README.md LICENSE ./
COPY dispatcher ./dispatcher
COPY localcluster ./localcluster
RUN python3 -m pip wheel --no-cache-dir --wheel-dir /wheels . pip \
    && python3 -m venv --without-pip /opt/dispatcher \
    && /opt/dispatcher/bin/python "$(echo /wheels/pip-*.whl)"/pip install --no-index \
        --no-cache-dir --no-compile --disable-pip-version-check --find-links /wheels \
        appwrapper-dispatcher \
    && /opt/dispatcher/bin/python -m compileall -q --invalidation-mode unchecked-hash \
        /opt/dispatcher

FROM debian:bookworm-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m compileall -q -f --invalidation-mode unchecked-hash \
        /usr/lib/python3.11 /usr/lib/python3/dist-packages
COPY --from=build /opt/dispatcher /opt/dispatcher
ENV PATH=/opt/dispatcher/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
LABEL org.opencontainers.image.title="dispatcher" \
      org.opencontainers.image.version="0.1.0"
USER 65532:65532
WORKDIR /
EXPOSE 8080 9443
ENTRYPOINT ["dispatcher"]
CMD ["run", "--metrics-port", "8080"]
