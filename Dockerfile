# The criticalsvc webhook image: `docker build -t criticalsvc:0.1.0 .`
#
# Base pinned to a Python patch release on a Debian release (3.11 is what the project is tested
# with). Pin the digest as well (FROM python:3.11.14-slim-bookworm@sha256:<digest>) once you have
# checked it against your registry: the machines this project is built on have no Docker engine or
# registry access, so no digest written here could have been verified.
FROM python:3.11.14-slim-bookworm

# No .pyc writes at run time (the root filesystem is read-only in the Deployment); logs unbuffered.
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# deploy/ and api/ are installed too (under /usr/local/share/criticalsvc) for `criticalsvc manifests`.
COPY pyproject.toml README.md /src/
COPY criticalsvc/ /src/criticalsvc/
COPY deploy/ /src/deploy/
COPY api/ /src/api/
RUN pip install --no-cache-dir /src && rm -rf /src

# 65532 is the conventional "nonroot" uid/gid (distroless); numeric, so the kubelet can check
# runAsNonRoot without reading /etc/passwd. Nothing in the image is writable by it.
USER 65532:65532
WORKDIR /
EXPOSE 8443 8081
ENTRYPOINT ["criticalsvc"]
CMD ["serve", "--listen", ":8443", "--tls-cert", "/tls/tls.crt", "--tls-key", "/tls/tls.key", "--ops-listen", ":8081", "--shutdown-delay", "5"]
