#!/usr/bin/env bash
# A throwaway PostgreSQL server for the tests and for trying the multi-replica setup locally.
#
#   scripts/postgres.sh start    start it (initialising and installing it first if needed) and
#                                print its SQLAlchemy URL; a no-op when it already runs
#   scripts/postgres.sh url      print the URL only
#   scripts/postgres.sh status   exit 0 when it runs
#   scripts/postgres.sh stop     stop it (the data stays; delete MBN_PG_DIR to start afresh)
#
# Only the URL goes to stdout, so `export MBN_TEST_POSTGRES_URL=$(scripts/postgres.sh start)` works.
# The server trades durability for speed (fsync off): it is for tests, never for data you keep.
set -euo pipefail

PG_DIR=$(realpath -m "${MBN_PG_DIR:-/tmp/mbn-postgres}")   # data/, socket/, server.log
PG_PORT=${MBN_PG_PORT:-55432}             # on 127.0.0.1 only
PG_DB=${MBN_PG_DB:-mbn}
PG_USER=${MBN_PG_USER:-mbn}
PG_PASSWORD=${MBN_PG_PASSWORD:-mbn}
OS_USER=${MBN_PG_OS_USER:-postgres}       # PostgreSQL refuses to run as root: used when we are root

DATA=$PG_DIR/data
SOCKET=$PG_DIR/socket
LOG=$PG_DIR/server.log

log() { echo "postgres.sh: $*" >&2; }

url() {
    echo "postgresql+psycopg://$PG_USER:$PG_PASSWORD@127.0.0.1:$PG_PORT/$PG_DB"
}

# The directory holding initdb/pg_ctl/postgres/psql: MBN_PG_BIN, else the newest Debian
# /usr/lib/postgresql/*/bin, else wherever initdb is on PATH.
find_bindir() {
    if [[ -n ${MBN_PG_BIN:-} ]]; then
        echo "$MBN_PG_BIN"
        return
    fi
    local dir
    dir=$(find /usr/lib/postgresql -maxdepth 2 -name bin -type d 2>/dev/null | sort -V | tail -n 1 || true)
    if [[ -n $dir && -x $dir/initdb ]]; then
        echo "$dir"
    elif command -v initdb >/dev/null; then
        dirname "$(command -v initdb)"
    fi
}

install_server() {
    [[ $(id -u) == 0 ]] || { log "no PostgreSQL server binaries found; install postgresql (as root)"; exit 1; }
    local apt_log=$PG_DIR.apt.log
    log "installing PostgreSQL with apt-get (log: $apt_log)"
    mkdir -p "$(dirname "$PG_DIR")"
    export DEBIAN_FRONTEND=noninteractive
    if ! { apt-get update -qq && apt-get install -y -qq --no-install-recommends postgresql; } \
        >"$apt_log" 2>&1; then
        tail -n 30 "$apt_log" >&2
        exit 1
    fi
}

# Run a command as the server's owner: ourselves, or OS_USER when we are root.
as_owner() {
    if [[ $(id -u) == 0 ]]; then
        runuser -u "$OS_USER" -- "$@"
    else
        "$@"
    fi
}

is_running() {
    [[ -f $DATA/PG_VERSION ]] && as_owner "$BIN/pg_ctl" -D "$DATA" status >/dev/null 2>&1
}

init_cluster() {
    log "initialising a cluster in $DATA"
    if [[ $(id -u) == 0 ]] && ! id -u "$OS_USER" >/dev/null 2>&1; then
        useradd --system --user-group --no-create-home --shell /usr/sbin/nologin "$OS_USER"
    fi
    mkdir -p "$PG_DIR"
    if [[ $(id -u) == 0 ]]; then
        chown "$OS_USER:" "$PG_DIR"
    fi
    # The socket directory is private (0700): local connections are trusted, TCP ones need the password.
    as_owner mkdir -p -m 0700 "$SOCKET"
    as_owner "$BIN/initdb" -D "$DATA" -U postgres -E UTF8 --no-locale \
        --auth-local=trust --auth-host=scram-sha-256 >"$PG_DIR/initdb.log" 2>&1 \
        || { cat "$PG_DIR/initdb.log" >&2; exit 1; }
    cat >>"$DATA/postgresql.conf" <<CONF

# scripts/postgres.sh: a test server, fast rather than durable
fsync = off
synchronous_commit = off
full_page_writes = off
max_connections = 200
CONF
}

psql_admin() {
    as_owner "$BIN/psql" -X -h "$SOCKET" -p "$PG_PORT" -U postgres -d postgres -v ON_ERROR_STOP=1 -qtA "$@"
}

ensure_role_and_db() {
    if [[ -z $(psql_admin -c "SELECT 1 FROM pg_roles WHERE rolname = '$PG_USER'") ]]; then
        psql_admin -c "CREATE ROLE \"$PG_USER\" LOGIN PASSWORD '$PG_PASSWORD'" >&2
    fi
    if [[ -z $(psql_admin -c "SELECT 1 FROM pg_database WHERE datname = '$PG_DB'") ]]; then
        psql_admin -c "CREATE DATABASE \"$PG_DB\" OWNER \"$PG_USER\"" >&2
    fi
}

start() {
    if is_running; then
        url
        return
    fi
    if [[ ! -f $DATA/PG_VERSION ]]; then
        init_cluster
    fi
    # Port, address and socket are given at every start, so changing MBN_PG_PORT just works.
    # 9>&-: the server must not inherit (and so hold forever) our lock.
    if ! as_owner "$BIN/pg_ctl" -D "$DATA" -l "$LOG" -w -t 60 \
        -o "-c listen_addresses=127.0.0.1 -c port=$PG_PORT -c unix_socket_directories=$SOCKET" \
        start >&2 9>&-; then
        log "failed to start; the end of $LOG:"
        tail -n 20 "$LOG" >&2 || true
        exit 1
    fi
    ensure_role_and_db
    url
}

stop() {
    if is_running; then
        as_owner "$BIN/pg_ctl" -D "$DATA" -m fast -w stop >&2
    else
        log "not running"
    fi
}

cd /   # the server's owner may not be allowed into the caller's directory
case ${1:-} in
    url)
        url
        ;;
    start)
        # Parallel callers (pytest -n 2 fixtures) must not install, initdb or start it twice.
        mkdir -p "$(dirname "$PG_DIR")"
        exec 9>"$PG_DIR.lock"
        flock 9
        BIN=$(find_bindir)
        if [[ -z $BIN ]]; then
            install_server
            BIN=$(find_bindir)
        fi
        start
        ;;
    stop)
        BIN=$(find_bindir)
        [[ -z $BIN ]] || stop
        ;;
    status)
        BIN=$(find_bindir)
        [[ -n $BIN ]] && is_running
        ;;
    *)
        echo "usage: $0 start|stop|status|url" >&2
        exit 2
        ;;
esac
