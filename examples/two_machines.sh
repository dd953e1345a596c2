#!/bin/sh
# A parameter server on one machine, its workers on another.
#
#   on the PS machine:      sh two_machines.sh ps PS_ADDRESS
#   copy key0 .. key{m-1} to the worker machine over a channel you trust (scp, a secrets manager)
#   on the worker machine:  sh two_machines.sh worker PS_ADDRESS
#
# Settings from the environment: WORKERS (m, 4), DELTA (2), ROUNDS (50), PORT (7733),
# OUT (runs/ps). Files are made and read in the current directory.
set -eu
role=${1:?usage: two_machines.sh ps|worker PS_ADDRESS}
host=${2:?usage: two_machines.sh ps|worker PS_ADDRESS}
workers=${WORKERS:-4}
port=${PORT:-7733}
last=$((workers - 1))

case "$role" in
ps)
    # The master secret: 32 random bytes, readable only by you. A non-loopback --host refuses
    # to start without it.
    if [ ! -f secret ]; then
        (umask 077 && head -c 32 /dev/urandom | base64 > secret)
    fi
    # One key per worker id: a worker machine that holds only its own ids' keys cannot
    # authenticate as any other worker (the master secret stays on this machine).
    for j in $(seq 0 "$last"); do
        (umask 077 && aiogc keys derive --secret-file secret --worker "$j" > "key$j")
    done
    echo "two_machines.sh: copy key0 .. key$last to the worker machine" >&2
    exec aiogc ps --host "$host" --port "$port" --workers "$workers" --delta "${DELTA:-2}" \
        --rounds "${ROUNDS:-50}" --secret-file secret --out "${OUT:-runs/ps}"
    ;;
worker)
    # One process per worker id; each reconnects with backoff and exits when the PS says
    # shutdown.
    for j in $(seq 0 "$last"); do
        aiogc worker --connect "$host:$port" --id "$j" --worker-key-file "key$j" &
    done
    wait
    ;;
*)
    echo "two_machines.sh: the role is ps or worker, not '$role'" >&2
    exit 2
    ;;
esac
