#!/bin/sh
# An example `tranche run --exec` command: it processes the row IDs
# TRANCHE_FROM..=TRANCHE_TO of partition TRANCHE_PID (attempt TRANCHE_ATTEMPT).
#
# The "work" is a stand-in for reindexing a table: it checksums the IDs. Replace
# the middle with your own (a SQL query over `id BETWEEN $TRANCHE_FROM AND
# $TRANCHE_TO`, an Elasticsearch bulk request, ...). Keep it idempotent: after a
# crash a chunk may run again. Exit 0 on success; anything else fails the chunk,
# and the tail of stderr becomes the partition's last error.
#
# Set TRANCHE_LOG to a file to record one line per chunk processed:
#   <pid> <from> <to> <checksum>
set -eu
: "${TRANCHE_PID:?run me through tranche run --exec}"
: "${TRANCHE_FROM:?}"
: "${TRANCHE_TO:?}"

sum=$(seq "$TRANCHE_FROM" "$TRANCHE_TO" | cksum | cut -d' ' -f1)

if [ -n "${TRANCHE_LOG:-}" ]; then
    # One short write: O_APPEND keeps concurrent chunks' lines whole.
    printf '%s %s %s %s\n' "$TRANCHE_PID" "$TRANCHE_FROM" "$TRANCHE_TO" "$sum" >> "$TRANCHE_LOG"
fi
