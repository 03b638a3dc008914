"""`specdash --engine sglang` (the dashboard, and headless) around a stand-in `sglang.Engine`
whose scheduler dies mid-request the way SGLang's does: a child process writes its reason and
sends SIGQUIT to its parent. With the real sglang wheel's `kill_process_tree`, the dashboard must
show the reason as an engine error, kill the scheduler, shut its engine down and keep running;
headless must print the reason on one line and exit 4, with no traceback.

The dashboard runs its session in a spawned engine process, so the stand-in is a module that
process imports by name (`dying_engine.run`): it patches SGLang's engine class there."""

from __future__ import annotations

import json

SETUP = r"""
import asyncio, json, os, signal, sys, time
from pathlib import Path
workdir = Path(os.environ["WORKDIR"])
sys.path.insert(0, "tests/sglang")  # the engine process imports the stand-in by name
import dying_engine
"""
DASHBOARD_SCRIPT = (
    SETUP
    + r"""
from specdash.cli import build_parser
from specdash.cli.dashboard import dashboard_app
from specdash.cli.session_args import describe
from specdash.ui.sources import LiveSession
from specdash.ui.widgets.help_screen import HelpScreen

async def main():
    before = signal.getsignal(signal.SIGQUIT)  # SIG_IGN when the test run is a background job
    app = dashboard_app(build_parser().parse_args(dying_engine.argv))
    built = app.source
    app.source = LiveSession(built.settings, False, built.engine_options, describe,
                             run=dying_engine.run)
    async with app.run_test(size=(160, 48)) as pilot:
        deadline = time.monotonic() + 60
        while not app.model.errors and time.monotonic() < deadline:
            await pilot.pause(0.1)
        await pilot.pause(0.3)
        untouched = signal.getsignal(signal.SIGQUIT) == before
        error_panel = str(app.query_one("#error").render())
        deadline = time.monotonic() + 10
        while app.source.running and time.monotonic() < deadline:
            await pilot.pause(0.1)
        engine_ended = not app.source.running
        await pilot.press("question_mark")  # the dashboard is alive and answers keys
        help_opened = isinstance(app.screen, HelpScreen)
        await pilot.press("escape", "q")
    return {
        "errors": [e.message for e in app.model.errors],
        "error_panel": error_panel,
        "untouched": untouched,
        "engine_ended": engine_ended,
        "help_opened": help_opened,
        "return_code": app.return_code,
        "engine": json.loads((workdir / "engine.json").read_text()),
        "here": os.getpid(),
    }

print("RESULT " + json.dumps(asyncio.run(main())))
"""
)


def test_scheduler_death_under_the_dashboard(run_sglang, tmp_path) -> None:
    env = {"HOME": str(tmp_path), "WORKDIR": str(tmp_path)}
    proc = run_sglang(DASHBOARD_SCRIPT, env=env)
    r = json.loads(next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))[7:])
    # the line headless prints (SchedulerFailed is raised in the engine's main thread)
    assert r["errors"] == ["ValueError: weights on fire in layer 3"]
    assert "weights on fire" in r["error_panel"] and "session over" in r["error_panel"]
    assert r["untouched"]  # the dashboard's process installs no SIGQUIT handler
    engine = r["engine"]
    assert engine["pid"] != r["here"] and engine["on_main_thread"]  # in the engine process
    assert r["engine_ended"] and engine["mem_fraction_static"] == 0.3  # shut down
    assert engine["children"] == [-9]  # SGLang's kill_process_tree took the scheduler down
    assert r["help_opened"] and r["return_code"] == 0


HEADLESS_SCRIPT = (
    SETUP
    + r"""
from specdash.cli import main
code = main(["run", "--headless", *dying_engine.argv])
engine = json.loads((workdir / "engine.json").read_text())
print("RESULT " + json.dumps({"code": code, "engine": engine}))
"""
)


def test_scheduler_death_headless_is_one_line_and_exit_4(run_sglang, tmp_path) -> None:
    proc = run_sglang(HEADLESS_SCRIPT, env={"HOME": str(tmp_path), "WORKDIR": str(tmp_path)})
    r = json.loads(next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))[7:])
    assert r["code"] == 4 and r["engine"]["children"] == [-9]
    assert "specdash: error: ValueError: weights on fire in layer 3" in proc.stderr
    assert "Traceback" not in proc.stderr
