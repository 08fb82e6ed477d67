#!/bin/sh
# A `tranche run --exec` command that backfills a PostgreSQL column, fenced:
# every row of `users` gets email_lower = lower(email) over the chunk's IDs
# TRANCHE_FROM..=TRANCHE_TO, and records the lease's fencing token TRANCHE_FENCE.
#
#   psql "$DATABASE_URL" -c 'ALTER TABLE users ADD COLUMN fence bigint NOT NULL DEFAULT 0'
#   tranche plan --min 1 --max 1000000 --size 10000
#   DATABASE_URL=postgres://... tranche run --exec ./examples/backfill-postgres.sh
#
# The UPDATE writes only rows whose fence is below this lease's: a later lease
# on the same IDs (a retry, a reclaim after this worker froze, a split piece)
# has a larger token, so a late write of this one changes nothing it wrote.
# One statement, so a chunk is all or nothing; run again, it writes the same
# values: idempotent, as a tranche chunk must be. The connection string comes
# from DATABASE_URL (or the usual PG* variables).
set -eu
: "${TRANCHE_FROM:?run me through tranche run --exec}"
: "${TRANCHE_TO:?}"
: "${TRANCHE_FENCE:?}"

psql ${DATABASE_URL:+"$DATABASE_URL"} -X -q -v ON_ERROR_STOP=1 \
    -v from="$TRANCHE_FROM" -v to="$TRANCHE_TO" -v fence="$TRANCHE_FENCE" <<'SQL'
UPDATE users SET email_lower = lower(email), fence = :fence
 WHERE id BETWEEN :from AND :to AND fence < :fence;
SQL
