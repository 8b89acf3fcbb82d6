#!/bin/bash
# The study of docs/RESULTS.md: shared, norm, norm_gate, scalar_gate, lora (rank matched to
# norm_gate's bytes) and unique x 150/600/2400 training steps x 3 paired seeds, int8 and int4,
# with the step-shuffle and fragility probes, on the default corpus and on the Jargon File.
#
#   bash benchmarks/lengths.sh [OUT]          (OUT defaults to runs/lengths)
#
# The second corpus comes from Debian's jargon-text package (The Jargon File 4.4.7, public
# domain), installed for this study only: `apt-get install jargon-text`. Its lexicon entries
# from ':(TM):' to the last 'E' entry (459,475 bytes) are the corpus, about the size of the
# default one (466 KB), so evaluation costs the same on both.
#
# Stages: both corpora first at 150 and 600 steps, then each at all three lengths, which
# reuses those checkpoints (--checkpoints) and trains the 2400-step models; a run cut short
# keeps whole lengths, and running this script again resumes it. /usr/bin/time -v prints each
# stage's CPU and wall time.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-runs/lengths}
RECURNORM=${RECURNORM:-.venv/bin/recurnorm}
JARGON_GZ=/usr/share/doc/jargon-text/jargon.txt.gz
DRY_RUN=${DRY_RUN:-}
go() {  # run the command, or under DRY_RUN print it (shell-quoted)
  if [ -n "$DRY_RUN" ]; then printf '+'; printf ' %q' "$@"; echo; else "$@"; fi
}
mkdir -p "$OUT"
if [ ! -f "$OUT/jargon-A-E.txt" ]; then
  if [ ! -f "$JARGON_GZ" ] && [ -n "$DRY_RUN" ]; then
    echo "jargon: skipped in the dry run's checks ($JARGON_GZ is missing: apt-get install jargon-text)"
  elif [ ! -f "$JARGON_GZ" ]; then
    echo "error: $JARGON_GZ is missing: apt-get install jargon-text (for this study only)" >&2
    exit 1
  else
    zcat "$JARGON_GZ" | sed -n '/^   :(TM): \/\/$/,/^   :F/p' | sed '$d' > "$OUT/jargon-A-E.txt.tmp"
    mv "$OUT/jargon-A-E.txt.tmp" "$OUT/jargon-A-E.txt"
  fi
fi

run() {  # corpus steps
  local data=default
  [ "$1" = jargon ] && data="$OUT/jargon-A-E.txt"
  echo "=== $1 $2 start $(date -Is)"
  go /usr/bin/time -v nice -n 5 "$RECURNORM" roundtrip \
    --schemes shared,norm,norm_gate,scalar_gate,lora,unique --quants int8,int4 \
    --seeds 3 --steps "$2" --preset sweep --probe shuffle --probe fragility \
    --match-bytes norm_gate --jobs 2 --threads 1 --data "$data" \
    --checkpoints "$OUT/ckpt-$1" --out "$OUT/rt-$1-${2//,/-}" --force --no-progress
  echo "=== $1 $2 end $(date -Is)"
}

run default 150,600
run jargon 150,600
run default 150,600,2400
run jargon 150,600,2400
