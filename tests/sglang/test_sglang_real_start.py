"""The dashboard starting the real SGLang engine, nothing of SGLang replaced: the real
`PatchedEngine` spawns its real scheduler and detokenizer processes (SGLang's CPU device gets
that far on a machine without a GPU), the scheduler runs specdash's entry and then fails on
the CPU in SGLang's own code. What must hold on the way there:

- the processes spawn at all under Textual. Its print capture stands in for sys.stderr with
  fileno() -1, which multiprocessing's resource tracker would pass on: every dashboard start
  on a GPU would fail with 'bad value(s) in fds_to_keep', which a faked engine class never sees;
- the scheduler's reason comes back as the dashboard's engine error, and its output goes to the
  SGLang log beside the trace, not over the TUI;
- the dashboard stays up and the trace is kept.

Only `preflight.check_startable` is replaced: it refuses a machine without CUDA before anything
starts.
"""

from __future__ import annotations

import json
from pathlib import Path

import specdash

TARGET = Path(specdash.__file__).parent / "data" / "target"  # SGLang fails on it: fine

REAL_START = r"""
import asyncio, json, sys, time
from pathlib import Path
from specdash.cli import build_parser
from specdash.cli.dashboard import dashboard_app
from specdash.cli.session_args import describe
from specdash.ui.sources import LiveSession

sys.path.insert(0, "tests/sglang")  # the engine process imports the unchecked start by name
import unchecked_start
out = Path(sys.argv[1])
argv = ["--engine", "sglang", "--model", sys.argv[2], "--sglang-arg", "device=cpu",
        "--speculative-algorithm", "NGRAM", "--max-new-tokens", "4",
        "--trace", str(out / "t.jsonl"),
        *sys.argv[3:]]

async def main():
    app = dashboard_app(build_parser().parse_args(argv))
    built = app.source
    app.source = LiveSession(built.settings, False, built.engine_options, describe,
                             run=unchecked_start.run)
    async with app.run_test(size=(160, 48)) as pilot:
        loading = ""
        for _ in range(50):  # the status bar redraws at its own rate (1 Hz), a key at once
            await pilot.pause(0.1)
            loading = str(app.dashboard.query_one("#status").render())
            if "SGLang's log" in loading:
                break
        deadline = time.monotonic() + 200
        while not app.model.errors and time.monotonic() < deadline:
            await pilot.pause(0.2)
        await pilot.pause(0.3)
        alive = app.is_running
        await pilot.press("q")
    return {"errors": [e.message for e in app.model.errors], "alive": alive, "loading": loading}

print("RESULT " + json.dumps(asyncio.run(main())))
"""


def test_dashboard_starts_the_real_engine(run_each_sglang, tmp_path) -> None:
    # 0.5.23 refuses speculation's Mamba snapshot buffer on a CPU before spawning anything
    extra = ["--sglang-arg", "mamba_radix_cache_strategy=no_buffer"]
    extra += ["--sglang-arg", "disable_overlap_schedule=true"]
    argv = [str(tmp_path), str(TARGET), *(extra if run_each_sglang.version == "0.5.23" else [])]
    proc = run_each_sglang(
        "import sys; sys.argv[1:] = " + repr(argv) + "\n" + REAL_START,
        env={"HOME": str(tmp_path)},
        timeout=300,
    )
    r = json.loads(next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))[7:])
    assert len(r["errors"]) == 1, r
    error = r["errors"][0]
    assert "fds_to_keep" not in error
    # the reason a child process died with, relayed from SGLang's own log line: the 0.5.17
    # scheduler while serving (SchedulerFailed), 0.5.23's detokenizer during the start
    log = (tmp_path / "t.jsonl.sglang.log").read_text()
    # (a missing module's line goes on with who imported it and what to do: sglang_preflight)
    reason = error.split(", imported by ")[0].rsplit(": ", 2)[-2:]
    assert "hit an exception" in log and ": ".join(reason) in log, (error, log[-2000:])
    assert "server_args=" in log and "server_args=" not in proc.stderr  # this process's too
    assert r["alive"]
    assert f"SGLang's log: {tmp_path / 't.jsonl.sglang.log'}" in r["loading"].replace("\n", "")
    assert (tmp_path / "t.jsonl").exists()
