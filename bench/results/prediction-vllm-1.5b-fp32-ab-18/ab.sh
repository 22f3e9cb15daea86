#!/bin/bash
# interleaved: plain, before, after per prompt and repeat
here=$(cd "$(dirname "$0")" && pwd)
out=$1; shift; reps=$1; shift
. ${VENV:-/work/main/.venv}/bin/activate
mkdir -p /tmp/exp/prof-before /tmp/exp/prof-after
for r in $(seq $reps); do for p in "$@"; do
  python "$here/ab_one.py" $p plain >> $out
  BSPEC_PROFILES=/tmp/exp/prof-before PYTHONPATH=${BEFORE:-/tmp/before} python "$here/ab_one.py" $p before >> $out
  BSPEC_PROFILES=/tmp/exp/prof-after PYTHONPATH=${AFTER:-/work/main} python "$here/ab_one.py" $p after >> $out
done; done
