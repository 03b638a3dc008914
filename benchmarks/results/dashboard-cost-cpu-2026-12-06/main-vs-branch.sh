#!/bin/bash
# main vs this branch: benchmarks/bench_dashboard.py from each tree, one after the other
PY=/work/wt/i32/.venv/bin/python
for tree in wt_mine wt_main wt_mine wt_main wt_mine; do
  echo "=== $tree $(git -C /tmp/i32/$tree log --oneline -1 | cut -c1-12) $(date -u +%FT%TZ) load $(cut -d' ' -f1-3 /proc/loadavg)"
  (cd /tmp/i32/$tree && PYTHONPATH=/tmp/i32/$tree flock /tmp/specdash-bench.lock $PY benchmarks/bench_dashboard.py --no-process --repeats 2)
done
