#!/usr/bin/env bash
# Set up everything the test suite needs, then run it: `bash scripts/run-tests.sh [pytest args]`.
#
# - a virtual environment in .venv with tuner and its dev/report/torch/llm extras (PyTorch as a CPU
#   build) and vLLM's CPU build (the llm_vllm template)
# - the tritonserver binary from the nvidia-pytriton wheel (a user cache; `tuner server install`)
# - as root on Debian: chromium (report test), docker.io + debootstrap (docker launcher tests), a
#   private Docker engine (no bridge, no iptables) and the CPU test image; stopped at the end;
#   postgresql (its binaries: the tests start a private cluster of their own, as the postgres user);
#   prometheus (its prometheus and promtool binaries: the tests start servers of their own)
# Elsewhere the docker, browser, PostgreSQL and Prometheus tests skip with a reason, unless
# TUNER_REQUIRE_ALL=1 (CI sets it), which makes them fail instead.
set -euo pipefail
cd "$(dirname "$0")/.."

python=${PYTHON:-python3}
step() { printf '\n==> %s\n' "$*" >&2; }

step "virtual environment (.venv)"
[ -x .venv/bin/python ] || "$python" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip

step "PyTorch and vLLM, their CPU builds (the encoder_torch and llm_vllm templates)"
PYTHON="$python" bash scripts/install-llm.sh
.venv/bin/python -m pip install -q -e '.[dev,report,torch,postgres,llm]'

step "tritonserver binary (nvidia-pytriton wheel, cached)"
.venv/bin/tuner server install

engine_started=""
cleanup() {
    if [ -n "$engine_started" ]; then
        step "stopping the private Docker engine"
        bash docker/stop-engine.sh || true
    fi
}
trap cleanup EXIT

if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    missing=()
    command -v chromium >/dev/null || missing+=(chromium)
    command -v dockerd >/dev/null || missing+=(docker.io)
    command -v debootstrap >/dev/null || missing+=(debootstrap)
    if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
        missing+=(postgresql)
        # only the binaries: no system-wide cluster created (nor started) by the package
        if [ ! -e /etc/postgresql-common/createcluster.conf ]; then
            mkdir -p /etc/postgresql-common
            echo "create_main_cluster = false" > /etc/postgresql-common/createcluster.conf
        fi
    fi
    prometheus_new=""
    if ! command -v prometheus >/dev/null || ! command -v promtool >/dev/null; then
        missing+=(prometheus)
        prometheus_new=1
    fi
    if [ ${#missing[@]} -gt 0 ]; then
        step "Debian packages: ${missing[*]}"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
            -o Dpkg::Options::=--force-confold "${missing[@]}" >/dev/null
    fi
    if [ -n "$prometheus_new" ]; then
        # the package's own service (port 9090, /var/lib/prometheus) is not left running: the tests
        # start servers of their own, each on a free port with its own data directory
        if [ -d /run/systemd/system ]; then
            systemctl disable --now prometheus >/dev/null 2>&1 || true
        elif [ -x /etc/init.d/prometheus ]; then
            /etc/init.d/prometheus stop >/dev/null 2>&1 || true
        fi
    fi
fi

if [ -f docker/start-engine.sh ] && command -v dockerd >/dev/null && [ "$(id -u)" = 0 ]; then
    step "private Docker engine and the CPU test image"
    eval "$(bash docker/start-engine.sh)"
    engine_started=1
    bash docker/build-test-image.sh
fi

step "test suite"
# Most of the suite waits on servers and replays in real time, not on the CPU: with three pytest workers
# (pytest-xdist) two cores were ~60 % busy and the tests took 26-28 minutes; four keep them ~80 % busy
# and took 20 (2026-12-07). The multi-process study tests, which time kills and heartbeats, take turns
# on a lock, and vLLM's engine tests run on one worker (tests/conftest.py). Each test file stays on one
# worker, the slowest first (tests/conftest.py orders them). TUNER_TEST_WORKERS=0 runs it in this process.
workers=${TUNER_TEST_WORKERS:-4}
parallel=()
[ "$workers" != 0 ] && parallel=(-n "$workers" --dist loadfile --no-loadscope-reorder)
set +e
.venv/bin/python -m pytest "${parallel[@]}" "$@"
status=$?
set -e
exit $status
