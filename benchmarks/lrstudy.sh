#!/bin/bash
# The learning-rate study of docs/RESULTS.md ("How to run the LR study"): every scheme at its
# own rate. Per corpus (default, then the Jargon File as in benchmarks/lengths.sh):
#   1. the sweep: shared, unique, norm, norm_gate, lora, layerrope, rezero, layerscale,
#      scalar_gate x AdamW peak rates 5e-4..8e-3 (x control_lr_mult 1 and 10 where a scheme
#      has step-specific controls) at 600 steps, one seed, chosen on one half of the
#      validation split (lora at the rank whose int8 bytes match norm_gate's, as in lengths.sh);
#   2. the paired comparison at each scheme's chosen setting, 600 and 2,400 steps, 3 seeds,
#      int8 and int4, reported on the other half (--sweep-from reuses stage 1).
#
#   bash benchmarks/lrstudy.sh [OUT]          (OUT defaults to runs/lrstudy)
#
# A stage cut short resumes when this script runs again: the sweep from its
# lr_sweep_runs.jsonl; a finished stage (its results.json exists) is skipped.
# /usr/bin/time -v prints each stage's CPU and wall time.
#
# DRY_RUN=1 (the smoke mode; seconds): print each stage's command instead of running it, and go
# on without the Jargon File when it is not installed (tests/test_benchmarks.py checks that every
# printed command parses). A real run of even one stage takes hours on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-runs/lrstudy}
RECURNORM=${RECURNORM:-.venv/bin/recurnorm}
SCHEMES=shared,unique,norm,norm_gate,lora,layerrope,rezero,layerscale,scalar_gate
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

data_of() { if [ "$1" = jargon ]; then echo "$OUT/jargon-A-E.txt"; else echo default; fi; }

sweep() {  # corpus
  [ -f "$OUT/sweep-$1/results.json" ] && return
  echo "=== sweep $1 start $(date -Is)"
  go /usr/bin/time -v nice -n 5 "$RECURNORM" roundtrip --schemes "$SCHEMES" \
    --lr-sweep 5e-4,1e-3,2e-3,4e-3,8e-3 --control-lr-mult 1,10 --sweep-only --match-bytes norm_gate \
    --steps 600 --preset sweep --threads 1 --data "$(data_of "$1")" --out "$OUT/sweep-$1" --no-progress
  echo "=== sweep $1 end $(date -Is)"
}

compare() {  # corpus
  [ -f "$OUT/tuned-$1/results.json" ] && return
  echo "=== compare $1 start $(date -Is)"
  go /usr/bin/time -v nice -n 5 "$RECURNORM" roundtrip --schemes "$SCHEMES" --quants int8,int4 \
    --sweep-from "$OUT/sweep-$1/results.json" --seeds 3 --steps 600,2400 --preset sweep \
    --probe shuffle --probe fragility --match-bytes norm_gate --jobs 2 --threads 1 --data "$(data_of "$1")" \
    --out "$OUT/tuned-$1" --force --no-progress
  echo "=== compare $1 end $(date -Is)"
}

sweep default
sweep jargon
compare default
compare jargon
