#!/bin/bash
# The arm64 machine's first boot (infra/arm64_test.sh builds its root filesystem): debootstrap's second stage
# (the arm64 binaries can only run here, under the emulated CPU), then the service's venv from the wheelhouse
# the host downloaded (manylinux aarch64 wheels; no network needed here). Ends by powering the machine off;
# the host reads the console for SANDLOT-BUILD-OK.
set -uo pipefail
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev 2>/dev/null
fail() { echo "SANDLOT-BUILD-FAILED: $*"; sync; echo o >/proc/sysrq-trigger; sleep 10; }
step() { echo "arm64 build: $* ($(cut -d' ' -f1 /proc/uptime) s)"; }
if [ -x /debootstrap/debootstrap ]; then
    step "debootstrap second stage"
    /debootstrap/debootstrap --second-stage || { tail -40 /debootstrap/debootstrap.log; fail "second stage"; }
    mountpoint -q /proc || mount -t proc proc /proc
fi
step "modules"
depmod -a "$(ls /lib/modules)" || fail depmod
step "venv"
python3 -m venv /opt/sandlot/venv || fail venv
/opt/sandlot/venv/bin/pip install --quiet --disable-pip-version-check --no-index --find-links /opt/sandlot/wheels \
    -r /opt/sandlot/wheels/requirements.txt || fail "pip install"
# the venv tests/unprivileged.py makes for services of another uid (the stand-ins' pytest runs here), made
# now, offline, under the name it looks for
step "tests' venv"
tests=/var/cache/sandlot-tests/$(cat /opt/sandlot/wheels/tests-venv)
mkdir -p -m 0755 /var/cache/sandlot-tests
(umask 022 && /usr/bin/python3.11 -m venv "$tests" && "$tests/bin/pip" install --quiet --disable-pip-version-check \
    --no-index --find-links /opt/sandlot/wheels -r /opt/sandlot/wheels/tests-requirements.txt) || fail "tests' venv"
touch "$tests/.complete"
rm -rf /opt/sandlot/wheels
chmod -R a+rX,go-w /opt/sandlot
step "node $(/usr/local/bin/node --version) npm $(/usr/local/bin/npm --version)" || fail node
/usr/local/bin/node -e 'process.exit(process.arch === "arm64" ? 0 : 1)' || fail "node is not arm64"
echo sandlot-arm64 >/etc/hostname
mkdir -m 0700 -p /var/cache/sandlot
apt-get clean
rm -rf /var/lib/apt/lists/*
step done
echo SANDLOT-BUILD-OK
sync
echo o >/proc/sysrq-trigger
sleep 10
