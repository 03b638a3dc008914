#!/bin/bash
# main (engine thread in the UI's process) vs this branch (engine in a child process):
# each tree's own benchmarks/bench_dashboard.py, alternating, each run under the shared bench lock.
# $1: the prompt file (decode-bound: the first 8 shipped prompts), or "shipped"
PY=/work/wt/uiproc/.venv/bin/python
MINE=/work/wt/uiproc
MAIN=/tmp/uiproc/wt_main   # git worktree add --detach of main
prompts=()
[ "$1" != shipped ] && prompts=(--prompts "$1")
repeats=${2:-3}
for tree in $MAIN $MINE $MAIN $MINE; do
  echo "=== $tree $(git -C $tree log --oneline -1 | cut -c1-60) $(date -u +%FT%TZ) load $(cut -d' ' -f1-3 /proc/loadavg)"
  if [ $tree = $MINE ]; then modes=(--only dashboard-thread dashboard-process); else modes=(--no-process); fi
  (cd $tree && PYTHONPATH=$tree flock /tmp/specdash-bench.lock $PY benchmarks/bench_dashboard.py --repeats $repeats "${prompts[@]}" "${modes[@]}")
done
