#!/usr/bin/env bash
# Build tuner's CPU test image with no image registry:
#   1. a Debian bookworm minbase root file system from debootstrap (cached as a tarball),
#   2. `docker import` of it as tuner/debian:bookworm-minbase,
#   3. docker/Dockerfile FROM that base, copying tritonserver, the wheel's libraries and the
#      Python backend with the CPython 3.11 stub.
# Idempotent: each step is skipped when its result exists (the final image carries a label with a
# fingerprint of what went into it). Prints the image tag on stdout.
#
# Environment: DOCKER_HOST (the engine, see start-engine.sh), TUNER_CACHE_DIR (default
# ~/.cache/tuner), TUNER_TEST_IMAGE (default tuner/tritonserver-cpu:2.51.0), TUNER_DEBIAN_MIRROR
# (default: the Debian mirror in /etc/apt/sources.list*), TUNER_TRITON_SITE (the folder holding the
# unpacked wheel's pytriton/ and nvidia_pytriton.libs/; default: what tuner's local launcher installs).
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(dirname "$HERE")
PY=$ROOT/.venv/bin/python  # tuner's own environment knows where its tritonserver is
[[ -x $PY ]] || PY=${PYTHON:-python3}
CACHE=${TUNER_CACHE_DIR:-$HOME/.cache/tuner}/docker
IMAGE=${TUNER_TEST_IMAGE:-tuner/tritonserver-cpu:2.51.0}
BASE=tuner/debian:bookworm-minbase
ROOTFS_TAR=$CACHE/debian-bookworm-minbase.tar
PYVER=3.11

log() { echo "build-test-image: $*" >&2; }
die() { log "$*"; exit 1; }

command -v docker >/dev/null || die "no docker client; run docker/start-engine.sh first"
docker version --format '{{.Server.Version}}' >/dev/null 2>&1 \
    || die "no Docker engine at ${DOCKER_HOST:-the default socket}; run: eval \"\$(docker/start-engine.sh)\""
mkdir -p "$CACHE"

# --- where the tritonserver comes from ---------------------------------------------------------
find_site() {
    if [[ -n ${TUNER_TRITON_SITE:-} ]]; then echo "$TUNER_TRITON_SITE"; return; fi
    # the local launcher's installer knows where the wheel is (and installs it if needed)
    if "$PY" - <<'PYEOF' 2>/dev/null; then return; fi
from tuner.server.install import find_tritonserver
print(find_tritonserver().root)  # holds pytriton/ and nvidia_pytriton.libs/
PYEOF
    return 1
}
SITE=$(find_site) || die "cannot find the nvidia-pytriton wheel; set TUNER_TRITON_SITE"
TS=$SITE/pytriton/tritonserver
for f in "$TS/bin/tritonserver" "$TS/backends/python/libtriton_python.so" \
         "$TS/python_backend_stubs/$PYVER/triton_python_backend_stub" "$SITE/nvidia_pytriton.libs"; do
    [[ -e $f ]] || die "missing $f (TUNER_TRITON_SITE=$SITE)"
done

# --- 1+2: the base image --------------------------------------------------------------------
if docker image inspect "$BASE" >/dev/null 2>&1; then
    log "base image $BASE exists"
else
    if [[ ! -s $ROOTFS_TAR ]]; then
        command -v debootstrap >/dev/null || die "debootstrap missing (docker/start-engine.sh installs it)"
        # the machine's own Debian mirror (a user behind a mirror or a proxy needs that one): deb822
        # `URIs:` lines may list several; one-line `deb [options] URI suite ...` may carry options
        MIRROR=${TUNER_DEBIAN_MIRROR:-$(
            { grep -hE '^URIs:' /etc/apt/sources.list.d/*.sources 2>/dev/null \
                  | sed -E 's/^URIs:[[:space:]]*//' | tr -s ' \t' '\n' || true
              grep -hE '^deb[[:space:]]' /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null \
                  | sed -E 's/^deb[[:space:]]+(\[[^]]*\][[:space:]]+)?([^[:space:]]+).*/\2/' || true
            } | grep -E '/debian/?$' | head -n1 || true)}
        [[ -n $MIRROR ]] || die "no Debian mirror in /etc/apt/sources.list*; set TUNER_DEBIAN_MIRROR"
        ROOTFS=$(mktemp -d "$CACHE/rootfs.XXXXXX")
        trap 'rm -rf "$ROOTFS"' EXIT
        log "debootstrap bookworm from $MIRROR (about a minute)"
        t0=$SECONDS
        debootstrap --variant=minbase --include=python3,python3-numpy,libpython3.11 \
            bookworm "$ROOTFS" "$MIRROR" >"$CACHE/debootstrap.log" 2>&1 \
            || { tail -n 20 "$CACHE/debootstrap.log" >&2; die "debootstrap failed (log: $CACHE/debootstrap.log)"; }
        rm -rf "$ROOTFS"/var/cache/apt/archives/*.deb "$ROOTFS"/var/lib/apt/lists/*
        tar -C "$ROOTFS" -cf "$ROOTFS_TAR.part" .
        mv "$ROOTFS_TAR.part" "$ROOTFS_TAR"
        rm -rf "$ROOTFS"; trap - EXIT
        log "root file system cached in $ROOTFS_TAR ($((SECONDS - t0)) s)"
    else
        log "using cached root file system $ROOTFS_TAR"
    fi
    docker import -c 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        -m "debootstrap --variant=minbase bookworm" - "$BASE" <"$ROOTFS_TAR" >/dev/null
    log "imported $BASE"
fi

# --- 3: the test image ----------------------------------------------------------------------
# fingerprint of the inputs: the Dockerfile, the base image id and every file copied in
FPRINT=$( {
    sha256sum "$HERE/Dockerfile"
    docker image inspect --format '{{.Id}}' "$BASE"
    find -L "$TS/bin/tritonserver" "$TS/backends/python/libtriton_python.so" \
        "$TS/backends/python/triton_python_backend_utils.py" "$TS/python_backend_stubs/$PYVER" \
        "$SITE/nvidia_pytriton.libs" -type f -printf '%p %s %T@\n' | sort
} | sha256sum | cut -c1-16)
if [[ $(docker image inspect --format '{{index .Config.Labels "tuner.fingerprint"}}' "$IMAGE" 2>/dev/null) == "$FPRINT" ]]; then
    log "image $IMAGE is up to date"
else
    CTX=$(mktemp -d "$CACHE/context.XXXXXX")
    trap 'rm -rf "$CTX"' EXIT
    mkdir -p "$CTX/bin" "$CTX/lib" "$CTX/backends/python"
    cp -L "$TS/bin/tritonserver" "$CTX/bin/"
    cp -L "$SITE/nvidia_pytriton.libs/"* "$CTX/lib/"
    cp -L "$TS/backends/python/libtriton_python.so" "$TS/backends/python/triton_python_backend_utils.py" \
        "$CTX/backends/python/"
    cp -L "$TS/python_backend_stubs/$PYVER/triton_python_backend_stub" "$CTX/backends/python/"
    cp "$HERE/Dockerfile" "$CTX/"
    log "building $IMAGE"
    # DOCKER_BUILDKIT=0: the classic builder works without buildx, which Debian's docker.io lacks
    DOCKER_BUILDKIT=0 docker build --build-arg "BASE=$BASE" --label "tuner.fingerprint=$FPRINT" \
        -t "$IMAGE" "$CTX" >"$CACHE/build.log" 2>&1 \
        || { tail -n 20 "$CACHE/build.log" >&2; die "docker build failed (log: $CACHE/build.log)"; }
    rm -rf "$CTX"; trap - EXIT
    log "built $IMAGE"
fi
echo "$IMAGE"
