#!/usr/bin/env bash
# Stop the engine docker/start-engine.sh started (by its pidfile only), after removing the
# containers tuner left with its label. The data root is kept (it caches the test image) unless
# --purge is given.
set -euo pipefail

DIR=${TUNER_DOCKER_DIR:-/tmp/tuner-docker}
PIDFILE=$DIR/dockerd.pid
HOST=unix://$DIR/docker.sock

log() { echo "stop-engine: $*" >&2; }

if [[ ! -f $PIDFILE ]]; then
    log "no pidfile at $PIDFILE: no engine of ours is running"
elif pid=$(cat "$PIDFILE") && kill -0 "$pid" 2>/dev/null; then
    left=$(docker -H "$HOST" ps -aq --filter label=tuner.managed=1 2>/dev/null || true)
    if [[ -n $left ]]; then
        log "removing containers left with label tuner.managed=1: $left"
        # shellcheck disable=SC2086
        docker -H "$HOST" rm -f $left >/dev/null || true
    fi
    kill -TERM "$pid"
    for _ in $(seq 1 60); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.5
    done
    if kill -0 "$pid" 2>/dev/null; then
        log "dockerd (pid $pid) did not stop in 30 s; sending SIGKILL"
        kill -KILL "$pid" || true
    fi
    log "stopped dockerd (pid $pid)"
    rm -f "$PIDFILE"
else
    log "dockerd (pid $pid) is not running"
    rm -f "$PIDFILE"
fi

if [[ ${1:-} == --purge && -d $DIR ]]; then
    [[ -f $PIDFILE ]] && { log "not purging: $PIDFILE still exists"; exit 1; }
    # dockerd leaves a few mounts (e.g. exec/netns/default) behind; only those under our own root
    awk -v d="$DIR/" 'index($2, d) == 1 {print $2}' /proc/self/mounts | sort -r | while read -r m; do
        umount "$m" 2>/dev/null || umount -l "$m" || true
    done
    rm -rf "$DIR"
    log "removed $DIR"
fi
