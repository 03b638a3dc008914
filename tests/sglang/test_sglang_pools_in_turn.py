"""memory_pools_in_turn: two engines' pool sizing never overlaps, a process that dies holding its
turn frees it, a process takes its turn once, and only an engine's first rank takes one (the
real `run_scheduler_process` signatures of 0.5.17 and 0.5.23)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from specdash.runs.sglang.patches import memory_pools_in_turn as turn

REPO = Path(__file__).resolve().parents[2]

ENGINE = """
import json, os, sys, time
from specdash.runs.sglang.patches import memory_pools_in_turn as turn

hold_s, die = float(sys.argv[1]), sys.argv[2] == "die"
times = {}
init = turn._turn_first(lambda self: times.setdefault("measured", time.time()))
def allocate(self):  # the pools exist before the turn ends: the clock is read inside it
    time.sleep(hold_s)
    times["allocated"] = time.time()
pools = turn._turn_ends(allocate)
init(None)
init(None)  # the draft's model runner: the turn is already held
if die:
    print(json.dumps(times), flush=True)
    os._exit(3)
pools(None)
times["env_after"] = os.environ.get(turn.TURN_ENV)
print(json.dumps(times), flush=True)
"""


def start(lock: Path, hold_s: float, mode: str = "live") -> subprocess.Popen[str]:
    env = {**os.environ, turn.TURN_ENV: str(lock), "PYTHONPATH": str(REPO)}
    argv = [sys.executable, "-c", ENGINE, str(hold_s), mode]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=env)


def times(proc: subprocess.Popen[str]) -> dict:
    out, _ = proc.communicate(timeout=60)
    return json.loads(out.splitlines()[-1])


def test_two_engines_size_their_pools_one_after_the_other(tmp_path) -> None:
    lock = tmp_path / "turn"
    a, b = start(lock, 1.0), start(lock, 1.0)
    ta, tb = times(a), times(b)
    assert a.returncode == b.returncode == 0
    first, second = sorted([ta, tb], key=lambda t: t["measured"])
    assert second["measured"] >= first["allocated"]  # measured after the other's pools exist
    assert first["env_after"] is None and second["env_after"] is None


def test_a_process_that_dies_in_its_turn_frees_it(tmp_path) -> None:
    lock = tmp_path / "turn"
    dead = start(lock, 0.0, "die")
    times(dead)
    assert dead.returncode == 3
    t0 = time.time()
    after = times(start(lock, 0.0))
    assert after["measured"] - t0 < 30


def test_without_the_variable_nothing_waits(monkeypatch) -> None:
    monkeypatch.delenv(turn.TURN_ENV, raising=False)
    assert turn.take_turn() == 0.0 and turn._held is None


FIRST_RANK = """
import inspect, json
from sglang.srt.managers.scheduler import run_scheduler_process
from specdash.runs.sglang.process import first_rank

names = list(inspect.signature(run_scheduler_process).parameters)

def args(**ranks):
    return tuple(ranks.get(n, 0 if n.endswith("_rank") else None) for n in names[:-3])

print(json.dumps({
    "first": first_rank(run_scheduler_process, args(), {}),
    "dp_none": first_rank(run_scheduler_process, args(dp_rank=None), {}),
    "tp1": first_rank(run_scheduler_process, args(tp_rank=1), {}),
    "pp1": first_rank(run_scheduler_process, args(pp_rank=1), {}),
    "tp1_keyword": first_rank(run_scheduler_process, args()[:3], {"tp_rank": 1}),
    "unbound": first_rank(run_scheduler_process, args() + (1, 2, 3, 4, 5), {}),
}))
"""


def test_only_an_engines_first_rank_takes_a_turn(run_each_sglang) -> None:
    r = json.loads(run_each_sglang(FIRST_RANK).stdout.splitlines()[-1])
    assert r == {
        "first": True,
        "dp_none": True,
        "tp1": False,
        "pp1": False,
        "tp1_keyword": False,
        "unbound": False,
    }
