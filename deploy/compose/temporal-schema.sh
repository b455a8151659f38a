#!/bin/sh
# Create the Temporal databases and bring their schemas up to this release's version.
# Runs in temporalio/admin-tools before the server starts (and, natively, in the production
# test tier); safe to run again: an existing database is kept and only migrated forward.
# A database whose schema is newer than this release's (a downgrade, or admin-tools older
# than the server that migrated it) is refused with both versions named, exit status 1.
set -eu

host="${POSTGRES_SEEDS:-postgresql}"
port="${DB_PORT:-5432}"
user="${POSTGRES_USER:-temporal}"
export SQL_PASSWORD="${POSTGRES_PWD:?POSTGRES_PWD is not set}"
schema="${TEMPORAL_SCHEMA_DIR:-/etc/temporal/schema/postgresql/v12}"

sql() {
  temporal-sql-tool --plugin postgres12 --ep "$host" -p "$port" -u "$user" "$@"
}

for db in temporal temporal_visibility; do
  case "$db" in
    temporal) dir="$schema/temporal/versioned" ;;
    *) dir="$schema/visibility/versioned" ;;
  esac
  # This release's schema version: the newest vX.Y folder.
  want=$(for v in "$dir"/v*; do basename "$v"; done \
    | sed -n 's/^v\([0-9][0-9]*\.[0-9][0-9]*\)$/\1/p' | sort -t. -k1,1n -k2,2n | tail -n 1)
  if [ -z "$want" ]; then
    echo "error: no schema versions in $dir (set TEMPORAL_SCHEMA_DIR)" >&2
    exit 2
  fi
  sql --db "$db" create || echo "database $db exists"
  # setup-schema -v 0.0 only initialises the version table when it is missing.
  sql --db "$db" setup-schema -v 0.0 || echo "schema of $db already initialised"
  sql --db "$db" update-schema -d "$dir"
  # Up to date now, unless the database is ahead of this release: the tool refuses a
  # target older than the database's version and names both.
  if ! out=$(sql --db "$db" update-schema -d "$dir" -v "$want" 2>&1); then
    echo "error: database $db has a schema newer than this release's ($want, from $dir):" >&2
    echo "$out" | grep -o "start version '[^']*' must be less than end version '[^']*'" >&2 \
      || echo "$out" >&2
    echo "       Run the schema job of the Temporal release that migrated it, or restore it." >&2
    exit 1
  fi
  echo "database $db: schema $want"
done
echo "Temporal schemas are up to date"
