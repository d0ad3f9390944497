#!/usr/bin/env bash
# Start a private Docker engine for tuner's docker tests and print the DOCKER_HOST to use.
#
#   eval "$(docker/start-engine.sh)"     # exports DOCKER_HOST=unix://.../docker.sock
#
# The engine has its own data/exec roots, socket and pidfile under $TUNER_DOCKER_DIR
# (default /tmp/tuner-docker), so it never touches a system engine. It runs without a bridge
# (--bridge=none, --iptables=false): containers use host networking and bind 127.0.0.1.
# Idempotent: if the engine from an earlier call still answers, it is reused.
set -euo pipefail

DIR=${TUNER_DOCKER_DIR:-/tmp/tuner-docker}
SOCK=$DIR/docker.sock
PIDFILE=$DIR/dockerd.pid
LOG=$DIR/dockerd.log
HOST=unix://$SOCK

log() { echo "start-engine: $*" >&2; }

need=()
command -v dockerd >/dev/null || need+=(docker.io)
command -v debootstrap >/dev/null || need+=(debootstrap)
if ((${#need[@]})); then
    [[ $(id -u) == 0 ]] || { log "need root to install ${need[*]}"; exit 1; }
    log "installing ${need[*]} (Debian packages)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >&2
    apt-get install -y -qq --no-install-recommends "${need[@]}" >&2
fi

engine_answers() { docker -H "$HOST" version --format '{{.Server.Version}}' >/dev/null 2>&1; }

mkdir -p "$DIR/data" "$DIR/exec"
if [[ -f $PIDFILE ]] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null && engine_answers; then
    log "engine already running (pid $(cat "$PIDFILE"))"
else
    [[ $(id -u) == 0 ]] || { log "dockerd needs root"; exit 1; }
    rm -f "$PIDFILE" "$SOCK"
    log "starting dockerd (log: $LOG)"
    # setsid: the engine outlives this script and does not get the caller's Ctrl-C
    setsid dockerd --bridge=none --iptables=false --ip-masq=false \
        --data-root "$DIR/data" --exec-root "$DIR/exec" \
        -H "$HOST" --pidfile "$PIDFILE" >"$LOG" 2>&1 </dev/null &
    for _ in $(seq 1 120); do
        engine_answers && break
        sleep 0.5
    done
    if ! engine_answers; then
        log "dockerd did not answer on $SOCK within 60 s; last log lines:"
        tail -n 20 "$LOG" >&2 || true
        exit 1
    fi
    log "engine ready (pid $(cat "$PIDFILE"))"
fi
echo "export DOCKER_HOST=$HOST"
