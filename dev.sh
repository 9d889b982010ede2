#!/usr/bin/env bash
# Sets up Sandlot in ./.venv (idempotent), then serves or tests.
#   ./dev.sh serve [sandlot serve options]   start the service (local backend, port 8194)
#   ./dev.sh test  [pytest options]          lint, build the docs site, run the test suite
set -euo pipefail
cd "$(dirname "$0")"

PYTHON=${PYTHON:-python3}
VENV=.venv

setup() {  # setup [test]: "test" also brings what only the tests need (a browser for the admin page, mkdocs)
    local purpose=${1:-serve}
    if ! "$PYTHON" -c 'import sys; assert sys.version_info >= (3, 11)' 2>/dev/null; then
        echo "dev.sh: needs Python 3.11 or newer as '$PYTHON' (set PYTHON=...)" >&2
        exit 1
    fi
    local missing=()
    "$PYTHON" -c 'import ensurepip, venv' 2>/dev/null || missing+=(python3-venv)
    # grep reads it all: with pipefail, `grep -q` stopping at the first match can fail the pipe (SIGPIPE)
    ldconfig -p 2>/dev/null | grep libseccomp.so.2 >/dev/null || missing+=(libseccomp2)
    if [ "$(id -u)" = 0 ]; then
        command -v nft >/dev/null || missing+=(nftables)  # egress rules for runs with network
        # without root (a service started as another uid, as the tests do): the runs' way out of their
        # network namespace (runtimes/linux/pasta.py)
        command -v pasta >/dev/null || missing+=(passt)
    fi
    if [ ${#missing[@]} -gt 0 ]; then
        if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
            apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
        else
            echo "dev.sh: install ${missing[*]} first (apt-get install ${missing[*]})" >&2
            exit 1
        fi
    fi
    if [ "$purpose" = test ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        # the admin page in headless Chromium (tests/test_packages_page.py); without it those tests skip
        local browser=()
        command -v chromium >/dev/null || browser+=(chromium)
        command -v chromedriver >/dev/null || browser+=(chromium-driver)
        if [ ${#browser[@]} -gt 0 ]; then
            { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${browser[@]}" >/dev/null; } ||
                echo "dev.sh: could not install ${browser[*]}: the admin page's browser tests will skip" >&2
        fi
    fi
    if [ "$(id -u)" = 0 ] && [ -c /dev/net/tun ] && [ "$(stat -c %a /dev/net/tun)" = 600 ]; then
        chmod 0666 /dev/net/tun  # what Debian's udev gives it; pasta, without root, needs to open it
    fi
    [ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
    local extras=test
    if [ "$purpose" = test ]; then extras=test,docs; fi  # the docs site's build is part of the test command
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -e ".[$extras]"
}

command=${1:-}
shift || true
case "$command" in
    serve)
        setup
        exec "$VENV/bin/sandlot" serve "$@"
        ;;
    test)
        setup test
        "$VENV/bin/ruff" check .
        "$VENV/bin/ruff" format --check . >/dev/null || { "$VENV/bin/ruff" format --diff .; exit 1; }
        # the docs site: no broken link or anchor (--strict; not --quiet, which hides the warnings strict counts)
        site=$(mktemp -d)
        if ! built=$(NO_MKDOCS_2_WARNING=1 "$VENV/bin/mkdocs" build --strict --site-dir "$site" 2>&1); then
            rm -rf "$site"
            echo "$built" >&2
            echo "dev.sh: mkdocs build --strict failed" >&2
            exit 1
        fi
        rm -rf "$site"
        "$VENV/bin/sandlot" layers build >/dev/null
        exec "$VENV/bin/python" -m pytest "$@"
        ;;
    *)
        echo "usage: ./dev.sh serve|test [options]" >&2
        exit 2
        ;;
esac
