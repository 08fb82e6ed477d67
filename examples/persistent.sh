#!/bin/sh
# An example `tranche run --exec-persistent` command in plain shell: tranche
# starts it once per chunk in flight and keeps it running, sending one chunk a
# line on stdin and reading one answer a line on stdout:
#
#   {"pid":7,"chunk":2,"from":6201,"to":6300,"attempt":3,"fence":41}
#   ok                      (or `error: REASON`, `permanent: REASON`)
#
#   tranche run --exec-persistent examples/persistent.sh
#
# stdout is the answer channel: print anything else to stderr (tranche logs it).
# The "work" is process-range.sh's stand-in, one line per chunk in TRANCHE_LOG.
# What a warm process saves is what your own start costs: a connection, a
# loaded runtime; replace the middle with yours, and keep it idempotent.
#
# Set TRANCHE_LOG to a file to record one line per chunk processed:
#   <pid> <from> <to> <attempt> <fence> <shell's pid>
set -u

# The number after "NAME": in the request, into $v (no fork: this runs per chunk).
get() {
    v=${line#*\""$1"\":}
    v=${v%%[,\}]*}
}

while IFS= read -r line; do
    get pid; pid=$v
    get from; from=$v
    get to; to=$v
    get attempt; attempt=$v
    get fence; fence=$v
    case "$from$to" in
    *[!0-9]*|'') echo "permanent: a request I cannot read: $line"; continue ;;
    esac
    if [ -n "${TRANCHE_LOG:-}" ]; then
        # One short write: O_APPEND keeps concurrent processes' lines whole.
        printf '%s %s %s %s %s %s\n' "$pid" "$from" "$to" "$attempt" "$fence" "$$" \
            >> "$TRANCHE_LOG" || { echo "error: cannot write $TRANCHE_LOG"; continue; }
    fi
    echo ok
done
