#!/usr/bin/env python3
"""A `tranche run --exec-persistent` command in Python: backfills a PostgreSQL
column, fenced, over one connection kept for the process's life.

tranche starts it once per chunk in flight and keeps it running. Each chunk
comes as one JSON line on stdin; it answers one line on stdout:

    {"pid":7,"chunk":2,"from":6201,"to":6300,"attempt":3,"fence":41}
    ok                      (or `error: REASON`, `permanent: REASON`)

    psql "$DATABASE_URL" -c 'ALTER TABLE users ADD COLUMN fence bigint NOT NULL DEFAULT 0'
    tranche plan --min 1 --max 1000000 --size 10000
    DATABASE_URL=postgres://... tranche run --exec-persistent 'python3 examples/persistent-psycopg.py'

Every row of `users` with an ID in the chunk gets email_lower = lower(email)
and the lease's fencing token, as examples/backfill-postgres.sh does per
chunk with psql: the UPDATE writes only rows whose fence is below this
lease's, so a late write of a lease since lost changes nothing its successor
wrote. One statement in one transaction: a chunk is all or nothing, and run
again it writes the same values. What this saves over `--exec psql` is a
process start, a connection and a PostgreSQL backend per chunk.

`error:` fails the attempt (tranche retries it with back-off); a constraint
violation is `permanent:` (no retry can fix the row). A lost connection is
answered `error:` and opened again for the next chunk. stdout is the answer
channel: anything else goes to stderr, which tranche logs. Needs psycopg2
(Debian's `python3-psycopg2`, or `pip install psycopg2-binary`): tranche starts
one per chunk in flight, and psycopg2 imports in a third of psycopg 3's time.
The connection string comes from DATABASE_URL (or the usual PG* variables).
"""

import json
import os
import sys

import psycopg2

UPDATE = """
UPDATE users SET email_lower = lower(email), fence = %(fence)s
 WHERE id BETWEEN %(from)s AND %(to)s AND fence < %(fence)s
"""


def answer(line):
    """One answer line, flushed: tranche waits for it."""
    sys.stdout.write(line.replace("\n", " ") + "\n")
    sys.stdout.flush()


def connect():
    conn = psycopg2.connect(os.environ.get("DATABASE_URL", ""))
    conn.autocommit = True
    return conn


def main():
    conn = None
    for line in sys.stdin:
        try:
            req = json.loads(line)
            args = {k: int(req[k]) for k in ("from", "to", "fence")}
        except (ValueError, KeyError, TypeError) as e:
            answer(f"permanent: a request I cannot read: {e!r}")
            continue
        try:
            if conn is None or conn.closed:
                conn = connect()
            # One statement in autocommit is a transaction of its own: no BEGIN and
            # COMMIT, two round trips a chunk fewer.
            with conn.cursor() as cur:
                cur.execute(UPDATE, args)
            answer("ok")
        except psycopg2.IntegrityError as e:
            answer(f"permanent: {e}")
        except psycopg2.Error as e:
            if conn is not None and conn.closed:
                conn = None
            answer(f"error: {e}")


if __name__ == "__main__":
    main()
