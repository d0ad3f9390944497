#!/usr/bin/env bash
# Run `tuner nightly` for a scheduler and act on its exit code.
#
#   deploy/nightly.sh NIGHTLY.yaml
#
# 0 (keep) and 10 (change proposed) are both a successful night; on 10 the command in
# $TUNER_ON_CHANGE runs with the run directory as its argument (open a pull request with
# proposed/config.pbtxt and summary.md, post summary.md to a chat...). 3 (SLA unmeetable), 2 (bad
# input) and 1 (error, e.g. another run holds the lock) are passed through for the scheduler to alert on;
# 143: stopped by SIGTERM (the night's server and container are stopped; the next night starts afresh).
set -uo pipefail
nightly=${1:?usage: deploy/nightly.sh NIGHTLY.yaml}
tuner=${TUNER:-tuner}

# In the background, with SIGTERM/SIGINT passed on: a scheduler stops the job by signalling this
# script (PID 1 in a container), and tuner needs the signal itself to stop its server and container.
# The trap is set before tuner starts: a signal that arrives while it starts is passed on too.
child=
stopping=
trap 'stopping=1; [ -n "$child" ] && kill -TERM "$child" 2>/dev/null' TERM INT
"$tuner" nightly "$nightly" &
child=$!
[ -n "$stopping" ] && kill -TERM "$child" 2>/dev/null
wait "$child"
code=$?
while kill -0 "$child" 2>/dev/null; do  # `wait` returned early for a signal: wait for tuner's own exit
    wait "$child"
    code=$?
done
case $code in
    0) exit 0 ;;
    10)
        if [ -n "${TUNER_ON_CHANGE:-}" ]; then
            output=$("${PYTHON:-python3}" -c 'import sys; from tuner.nightly import load_nightly; print(load_nightly(sys.argv[1]).output)' "$nightly")
            $TUNER_ON_CHANGE "$(readlink -f "$output/latest")" || exit 1
        fi
        exit 0 ;;
    *) exit "$code" ;;
esac
