# The Sandlot service image: a drop-in for Dify's `sandbox` service (port 8194, API_KEY).
#   docker build -t sandlot .
#   docker run -p 8194:8194 -e API_KEY=... sandlot            # default privileges: the chroot jail
#   docker run -p 8194:8194 -e API_KEY=... --cap-add SYS_ADMIN --cap-add NET_ADMIN \
#              --security-opt apparmor=unconfined sandlot    # the full jail
# What each gives: README, "Running in a container" (infra/container_test.sh runs both with podman).
# (Lambda runtime images are built from infra/ and runtimes/<language>/, not from this file.)

FROM node:20-bookworm-slim AS node

FROM python:3.11-slim-bookworm

# libseccomp2: the filters; nftables: egress rules for runs with network; ca-certificates: the runs' CA bundle
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends libseccomp2 nftables ca-certificates \
    && rm -rf /var/lib/apt/lists/*

# node for nodejs runs (Debian bookworm's own is 18), and npm beside it for the Node.js layer's builds
COPY --from=node /usr/local/bin/node /usr/local/bin/node
COPY --from=node /usr/local/lib/node_modules/npm /usr/local/lib/node_modules/npm

# the package, into a world-readable venv (layer builds run pip from it as an unprivileged uid)
COPY pyproject.toml README.md /opt/sandlot/src/
COPY handler /opt/sandlot/src/handler
COPY runtimes /opt/sandlot/src/runtimes
COPY layers /opt/sandlot/src/layers
RUN python3.11 -m venv /opt/sandlot/venv \
    && /opt/sandlot/venv/bin/pip install --no-cache-dir /opt/sandlot/src \
    && rm -rf /opt/sandlot/src

ENV PATH=/opt/sandlot/venv/bin:$PATH \
    NODEJS_PATH=/usr/local/bin/node \
    SANDBOX_PORT=8194 \
    SANDLOT_DATA_DIR=/var/lib/sandlot

# the default dependency layers (layers/python, layers/nodejs), built now as the Lambda images' are, into a
# read-only store the service serves them from (layers/store.py: IMAGE_LAYERS): a new volume needs no package
# index for the defaults; an operator's additions still build into the volume. The build's uid must pass through
# its data dir (0711); the bytecode is compiled once here (runs read the layer read-only). pip's configuration
# listing is kept in /opt/sandlot/image-cache (runtimes/python/layer.py: pip_configuration): a container's build of
# an operator's additions then starts at once.
RUN install -d -m 0755 /opt/sandlot/image-cache \
    && install -d -m 0711 /opt/sandlot/image-data \
    && SANDLOT_CONFIG=/nonexistent SANDLOT_DATA_DIR=/opt/sandlot/image-data sandlot layers build >/dev/null \
    && mv /opt/sandlot/image-data/layers /opt/sandlot/image-layers \
    && rm -rf /opt/sandlot/image-data \
    && python3 -m compileall -q -j 0 --invalidation-mode unchecked-hash /opt/sandlot/image-layers/python \
    && chmod -R a+rX,go-w /opt/sandlot/image-layers

# the chroot jail's trees for the interpreter and those layers, with their cells (runtimes/jail/trees/image_trees.py),
# built now: hard links to the image's own files in this layer, so a container starts on them, copying nothing, and
# its zygotes read the same pages as the service. The standard library's bytecode is compiled first (python's slim
# images ship none: each zygote would compile what it imports at every start, its tree being read-only). What the
# trees' specs asked (the libraries ldd finds, the interpreter's paths) is kept in /opt/sandlot/image-cache
# (runtimes/linux/rootfs.py: IMAGE_CACHE), which a container's new volume would otherwise ask again at its start.
RUN python3 -m compileall -q -j 0 -x '/(tests?|idle_test)/' "$(python3 -c 'import sysconfig; print(sysconfig.get_path("stdlib"))')" \
    && install -d -m 0755 /opt/sandlot/image-cache \
    && install -d -m 0711 /opt/sandlot/image-data \
    && SANDLOT_CONFIG=/nonexistent SANDLOT_DATA_DIR=/opt/sandlot/image-data sandlot layers trees \
    && rm -rf /opt/sandlot/image-data

# the trees of an operator's additions (runtimes/jail/trees/tree_store.py), on the image's own filesystem, not on the
# data volume
RUN mkdir -m 0700 -p /var/cache/sandlot

# dify-sandbox's places, relative to the working directory: /conf/config.yaml and
# /dependencies/python-requirements.txt, so Dify's volume mounts work unchanged.
WORKDIR /
COPY conf/config.yaml.example /conf/config.yaml.example
VOLUME ["/var/lib/sandlot"]
EXPOSE 8194

HEALTHCHECK --interval=10s --timeout=5s --start-period=120s \
    CMD ["sandlot", "health"]
ENTRYPOINT ["sandlot"]
CMD ["serve"]
