#!/usr/bin/env bash
# Runs a command against a throwaway PostgreSQL: `tests/postgres.sh COMMAND [ARGS...]`.
#
# The Airflow tier runs on Postgres as well as SQLite because a deployment's metadata database is Postgres. This
# script installs PostgreSQL from the Debian packages when it is missing (as root only), starts a private server on
# 127.0.0.1 and a free port with a fresh database, exports SLUICE_TEST_AIRFLOW_DB (tests/conftest.py hands it to
# Airflow), runs the command, and always stops the server and deletes its data. Where PostgreSQL cannot be had, it
# prints why and skips the command. Its state lives in one folder per checkout, so the next run stops and removes
# what a killed run left behind.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
STATE=${SLUICE_PG_STATE:-/tmp/sluice-pg-$(id -u)-$(printf '%s' "$ROOT" | cksum | cut -d' ' -f1)}
DATA=$STATE/data
DATABASE=sluice_airflow
ROLE=sluice

say() { echo "postgres tier: $*" >&2; }

skip() {
    say "SKIPPED: $*"
    say "SKIPPED: the Airflow tests did not run against PostgreSQL."
    # CI (SLUICE_NO_SKIPS) runs where PostgreSQL can always be had: a skip there is a broken set-up.
    [[ -z ${SLUICE_NO_SKIPS:-} ]] || exit 1
    exit 0
}

server_bindir() {
    local candidate
    for candidate in ${SLUICE_PG_BINDIR:-} $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -rV) \
                     "$(dirname "$(command -v pg_ctl 2>/dev/null || echo /nonexistent/pg_ctl)")"; do
        if [[ -x $candidate/initdb && -x $candidate/pg_ctl && -x $candidate/postgres ]]; then
            echo "$candidate"
            return 0
        fi
    done
    return 1
}

install_postgres() {
    local log=/tmp/sluice-pg-apt-$$.log
    say "PostgreSQL is missing; installing it from the Debian packages"
    if ! { DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends postgresql ||
           { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends postgresql; }
         } >"$log" 2>&1; then
        tail -n 20 "$log" >&2
        rm -f "$log"
        return 1
    fi
    rm -f "$log"
}

# PostgreSQL refuses to run as root: the server and initdb run as the `postgres` user, from a folder it can enter.
as_server_user() {
    if [[ $(id -u) == 0 ]]; then
        (cd / && runuser -u postgres -- "$@")
    else
        "$@"
    fi
}

stop_server() {
    if [[ -f $DATA/postmaster.pid ]]; then
        as_server_user "$BINDIR/pg_ctl" -D "$DATA" -w -t 30 -m fast stop >/dev/null 2>&1 ||
            as_server_user "$BINDIR/pg_ctl" -D "$DATA" -w -t 30 -m immediate stop >/dev/null 2>&1 || true
    fi
}

cleanup() {
    local status=$?
    stop_server
    rm -rf "$STATE"
    exit "$status"
}

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

if [[ $# == 0 ]]; then
    echo "usage: $0 COMMAND [ARGS...]" >&2
    exit 2
fi

if ! BINDIR=$(server_bindir); then
    if [[ $(id -u) != 0 ]]; then
        skip "PostgreSQL is not installed and only root may install it (apt-get install postgresql)"
    fi
    command -v apt-get >/dev/null || skip "PostgreSQL is not installed and there is no apt-get to install it"
    install_postgres || skip "apt-get could not install PostgreSQL (see above)"
    BINDIR=$(server_bindir) || skip "PostgreSQL was installed but initdb/pg_ctl/postgres are not found"
fi
if [[ $(id -u) == 0 ]] && ! id postgres >/dev/null 2>&1; then
    skip "running as root, and there is no 'postgres' user to run the server as"
fi

# What a killed run left behind: a server that may still be up, its port, its data.
if [[ -d $STATE ]]; then
    say "stopping and removing what an earlier run left in $STATE"
    stop_server
    rm -rf "$STATE"
fi
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM HUP

mkdir -m 700 "$STATE"
[[ $(id -u) == 0 ]] && chown postgres: "$STATE"
PASSWORD=$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')
printf '%s\n' "$PASSWORD" >"$STATE/pwfile"
[[ $(id -u) == 0 ]] && chown postgres: "$STATE/pwfile"
as_server_user "$BINDIR/initdb" -D "$DATA" -U "$ROLE" --pwfile="$STATE/pwfile" --auth=scram-sha-256 \
    --encoding=UTF8 --locale=C --no-sync >"$STATE/initdb.log" 2>&1 || { cat "$STATE/initdb.log" >&2; exit 1; }
rm -f "$STATE/pwfile"
# A test database: only TCP on 127.0.0.1 (no socket in a shared folder), durability traded for speed.
as_server_user tee -a "$DATA/postgresql.conf" >/dev/null <<'EOF'
listen_addresses = '127.0.0.1'
unix_socket_directories = ''
fsync = off
synchronous_commit = off
full_page_writes = off
EOF

# The free port may be taken between the probe and the bind: try another.
for attempt in 1 2 3; do
    PORT=$(free_port)
    if as_server_user "$BINDIR/pg_ctl" -D "$DATA" -l "$STATE/server.log" -o "-p $PORT" -w -t 60 start >/dev/null; then
        break
    fi
    if [[ $attempt == 3 ]] || ! grep -q "could not bind" "$STATE/server.log"; then
        tail -n 20 "$STATE/server.log" >&2
        exit 1
    fi
done

export PGHOST=127.0.0.1 PGPORT=$PORT PGUSER=$ROLE PGPASSWORD=$PASSWORD PGOPTIONS="-c client_min_messages=warning"
"$BINDIR/dropdb" --if-exists "$DATABASE"
"$BINDIR/createdb" "$DATABASE"
unset PGHOST PGPORT PGUSER PGPASSWORD PGOPTIONS
export SLUICE_TEST_AIRFLOW_DB="postgresql+psycopg2://$ROLE:$PASSWORD@127.0.0.1:$PORT/$DATABASE"
say "PostgreSQL $("$BINDIR/postgres" --version | awk '{print $3}') on 127.0.0.1:$PORT, database $DATABASE (fresh)"

# Not exec: the trap has to stop the server when the command ends.
"$@"
