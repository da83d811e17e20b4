# The dispatcher's image: `docker build -t dispatcher:0.1.0 .` (deploy/ runs it).
#
# Python slim, the package and its controller extras installed from this checkout (the
# built-in policies are package data inside it), a non-root user. Nothing is written at
# run time: the pod runs with a read-only root filesystem.
FROM python:3.12-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY dispatcher ./dispatcher
RUN pip install --no-cache-dir --prefix=/install '.[controller]'

FROM python:3.12-slim
COPY --from=build /install /usr/local
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# A numeric user, so Kubernetes can check runAsNonRoot without reading /etc/passwd.
USER 65532:65532
EXPOSE 8080 9443
ENTRYPOINT ["dispatcher"]
CMD ["run", "--metrics-port", "8080"]
