#!/bin/sh
# Create the Temporal databases and bring their schemas up to the image's version.
# Runs in temporalio/admin-tools before the server starts; safe to run again (an
# existing database is kept and only migrated forward).
set -eu

host="${POSTGRES_SEEDS:-postgresql}"
port="${DB_PORT:-5432}"
user="${POSTGRES_USER:-temporal}"
export SQL_PASSWORD="${POSTGRES_PWD:?POSTGRES_PWD is not set}"
schema=/etc/temporal/schema/postgresql/v12

sql() {
  temporal-sql-tool --plugin postgres12 --ep "$host" -p "$port" -u "$user" "$@"
}

for db in temporal temporal_visibility; do
  case "$db" in
    temporal) dir="$schema/temporal/versioned" ;;
    *) dir="$schema/visibility/versioned" ;;
  esac
  sql --db "$db" create || echo "database $db exists"
  # setup-schema -v 0.0 only initialises the version table when it is missing.
  sql --db "$db" setup-schema -v 0.0 || echo "schema of $db already initialised"
  sql --db "$db" update-schema -d "$dir"
done
echo "Temporal schemas are up to date"
