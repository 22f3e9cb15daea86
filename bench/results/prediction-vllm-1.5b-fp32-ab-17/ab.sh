#!/bin/bash
# interleaved: plain, before, after per prompt and repeat
out=$1; shift; reps=$1; shift
. /work/main/.venv/bin/activate
mkdir -p /tmp/exp/prof-before /tmp/exp/prof-after
for r in $(seq $reps); do for p in "$@"; do
  python /tmp/exp/ab_one.py $p plain >> $out
  BSPEC_PROFILES=/tmp/exp/prof-before PYTHONPATH=/tmp/before python /tmp/exp/ab_one.py $p before >> $out
  BSPEC_PROFILES=/tmp/exp/prof-after PYTHONPATH=/work/main python /tmp/exp/ab_one.py $p after >> $out
done; done
