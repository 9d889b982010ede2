# Local stand-ins for the base images the Dockerfiles and SAM local use, tagged with the names they use,
# since no image registry is reachable here, and the podman settings both scripts run with. Sourced (bash) by
# infra/container_test.sh and infra/sam_local_test.sh; needs root, podman and debootstrap, and from the
# caller: STATE (a directory kept between runs) and say/fail.
#
#   standin_python_base     docker.io/library/python:3.11-slim-bookworm  (runtimes/python/Dockerfile, Dockerfile)
#   standin_node_base       docker.io/library/node:20-bookworm-slim      (runtimes/nodejs/Dockerfile, Dockerfile)
#   standin_lambda_python V public.ecr.aws/lambda/python:V-x86_64        (a Zip function of runtime pythonV)
#
# Each is Debian bookworm's minbase (debootstrap, made once and kept as a tarball under $STANDIN_CACHE) with:
#   python   Debian's python3 (3.11) and python3-venv, linked where the real image has its python
#            (/usr/local/bin/python3, python3.11);
#   node     this machine's node and npm under /usr/local (the real image's places), on the same minbase,
#            so that a Dockerfile's apt-get and python3 work there too;
#   lambda   this machine's CPython V (pyenv's build) as /var/lang, awslambdaric in /var/runtime and a
#            /var/runtime/bootstrap that runs `python3 -m awslambdaric "$_HANDLER"` in /var/task: what SAM's
#            emulator (the RIE) starts when the function has no bootstrap of its own.
# Every stand-in carries the label sandlot.standin; an image of that name without it (another script's
# narrower stand-in) is replaced by the tag, not removed.
# Downloads from inside go through this machine's network: its CA files are copied in, and the CA variables
# set (one `--change ENV` each: one ENV line with several pairs would set only the first, to the rest).

STANDIN_LABEL=sandlot.standin=bookworm-1
STANDIN_MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
STANDIN_BUNDLE=/etc/ssl/certs/ca-certificates.crt
STANDIN_CACHE=${STANDIN_CACHE:-/var/tmp/sandlot-standins} # the minbase tarball, one for both scripts

podman_conf() { # podman_conf FILE: this machine's podman settings, in FILE (for CONTAINERS_CONF)
    # runc (crun refuses the hybrid cgroup setup), open-file limits within the hard limit, and Docker's
    # default capability set (podman's own default leaves out MKNOD, NET_RAW, AUDIT_WRITE)
    cat >"$1" <<'EOF'
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]
default_capabilities = ["CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID", "SETPCAP",
  "NET_BIND_SERVICE", "NET_RAW", "SYS_CHROOT", "MKNOD", "AUDIT_WRITE", "SETFCAP"]
[engine]
runtime = "runc"
EOF
}

standin_ok() { # standin_ok IMAGE: the image exists and is one of these stand-ins
    [ "$(podman image inspect -f '{{index .Labels "sandlot.standin"}}' "$1" 2>/dev/null)" = "${STANDIN_LABEL#*=}" ]
}

standin_rootfs() { # standin_rootfs DIR APT-PACKAGES...: bookworm's minbase with these packages, in DIR
    local dir=$1
    shift
    local cache="$STANDIN_CACHE/bookworm-minbase.tar"
    mkdir -p "$STANDIN_CACHE"
    if [ ! -s "$cache" ]; then
        say "debootstrap of bookworm's minbase (once, about a minute)"
        rm -rf "$STATE/minbase"
        debootstrap --variant=minbase bookworm "$STATE/minbase" "$STANDIN_MIRROR" >"$STATE/debootstrap.log" 2>&1 ||
            fail "debootstrap: see $STATE/debootstrap.log"
        tar -C "$STATE/minbase" -cf "$cache.part" . && mv "$cache.part" "$cache"
        rm -rf "$STATE/minbase"
    fi
    rm -rf "$dir" && mkdir -p "$dir"
    tar -C "$dir" -xf "$cache"
    mkdir -p "$dir/usr/local/share/ca-certificates"
    cp /usr/local/share/ca-certificates/*.crt "$dir/usr/local/share/ca-certificates/" 2>/dev/null || true
    cp /etc/resolv.conf "$dir/etc/resolv.conf"
    chroot "$dir" /bin/sh -c "export DEBIAN_FRONTEND=noninteractive; apt-get update -q &&
        apt-get install -y -q --no-install-recommends ca-certificates $* && update-ca-certificates &&
        apt-get clean && rm -rf /var/lib/apt/lists/*" >"$STATE/apt-$(basename "$dir").log" 2>&1 ||
        fail "apt in the stand-in: see $STATE/apt-$(basename "$dir").log"
    : >"$dir/etc/resolv.conf"
}

standin_import() { # standin_import DIR IMAGE [--change ...]...: DIR as IMAGE, then DIR removed
    local dir=$1 image=$2
    shift 2
    tar -C "$dir" -c . | podman import --quiet --change "LABEL $STANDIN_LABEL" \
        --change "ENV LANG=C.UTF-8" --change "ENV PIP_CERT=$STANDIN_BUNDLE" \
        --change "ENV SSL_CERT_FILE=$STANDIN_BUNDLE" --change "ENV REQUESTS_CA_BUNDLE=$STANDIN_BUNDLE" \
        "$@" - "$image" >/dev/null || fail "podman import of $image"
    rm -rf "$dir"
}

standin_python_base() {
    local image=docker.io/library/python:3.11-slim-bookworm dir="$STATE/standin-python"
    standin_ok "$image" && return 0
    say "making the stand-in for $image"
    standin_rootfs "$dir" python3 python3-venv
    ln -sf /usr/bin/python3 "$dir/usr/local/bin/python3"
    ln -sf /usr/bin/python3.11 "$dir/usr/local/bin/python3.11"
    standin_import "$dir" "$image" --change 'CMD ["python3"]'
}

standin_node_base() {
    local image=docker.io/library/node:20-bookworm-slim dir="$STATE/standin-node"
    standin_ok "$image" && return 0
    say "making the stand-in for $image (this machine's node and npm)"
    standin_rootfs "$dir"
    mkdir -p "$dir/usr/local/bin" "$dir/usr/local/lib/node_modules"
    cp "$(readlink -f "$(command -v node)")" "$dir/usr/local/bin/node"
    local npm_dir
    npm_dir=$(dirname "$(dirname "$(readlink -f "$(command -v npm)")")")
    cp -a "$npm_dir" "$dir/usr/local/lib/node_modules/npm"
    ln -sf ../lib/node_modules/npm/bin/npm-cli.js "$dir/usr/local/bin/npm"
    standin_import "$dir" "$image" --change 'CMD ["node"]'
}

standin_lambda_python() { # standin_lambda_python 3.12
    local version=$1 image="public.ecr.aws/lambda/python:$1-x86_64" dir="$STATE/standin-lambda-python$1"
    standin_ok "$image" && return 0
    local home
    home=$(compgen -G "${PYENV_ROOT:-$HOME/.pyenv}/versions/$version.*" | sort -V | tail -1 || true)
    [ -x "$home/bin/python$version" ] ||
        fail "no CPython $version on this machine (pyenv's ${PYENV_ROOT:-$HOME/.pyenv}/versions/$version.*) for $image"
    say "making the stand-in for $image (CPython $(basename "$home") from $home)"
    standin_rootfs "$dir" libssl3 libffi8 libsqlite3-0 libbz2-1.0 liblzma5 libreadline8 libncursesw6 libuuid1 \
        libgdbm6 libexpat1 zlib1g
    mkdir -p "$dir/var/lang" "$dir/var/runtime" "$dir/var/task"
    tar -C "$home" --exclude="./lib/python$version/test" --exclude='__pycache__' -cf - . | tar -C "$dir/var/lang" -xf -
    python3 -m pip install --quiet --disable-pip-version-check --no-cache-dir --target "$dir/var/runtime" \
        --only-binary=:all: --platform manylinux2014_x86_64 --python-version "$version" --implementation cp \
        awslambdaric >"$STATE/pip-lambda-python$version.log" 2>&1 ||
        fail "awslambdaric for CPython $version: see $STATE/pip-lambda-python$version.log"
    cat >"$dir/var/runtime/bootstrap" <<'EOF'
#!/bin/sh
# the stand-in's runtime: what the RIE starts for a Zip function without a bootstrap of its own
cd "${LAMBDA_TASK_ROOT:-/var/task}" || exit 1
exec /var/lang/bin/python3 -m awslambdaric "$_HANDLER"
EOF
    chmod 0755 "$dir/var/runtime/bootstrap"
    chmod -R a+rX "$dir/var/lang" "$dir/var/runtime"
    standin_import "$dir" "$image" \
        --change "ENV PATH=/var/lang/bin:/usr/local/bin:/usr/bin:/bin" \
        --change "ENV LD_LIBRARY_PATH=/var/lang/lib" \
        --change "ENV LAMBDA_TASK_ROOT=/var/task" --change "ENV LAMBDA_RUNTIME_DIR=/var/runtime" \
        --change "ENV PYTHONPATH=/var/runtime" --change "WORKDIR /var/task" \
        --change 'ENTRYPOINT ["/var/runtime/bootstrap"]'
}
