"""`specdash --engine sglang` (the dashboard, and headless) around a stand-in `sglang.Engine`
whose scheduler dies mid-request the way SGLang's does: a child process writes its reason and
sends SIGQUIT to its parent. With the real sglang wheel's `kill_process_tree`, the dashboard must
show the reason as an engine error, kill the child, shut its engine down and keep running;
headless must print the reason on one line and exit 4, with no traceback."""

from __future__ import annotations

import json

STAND_IN = r"""
import asyncio, json, os, signal, subprocess, sys, threading, time
from specdash.runs.sglang import preflight, process

SCHEDULER = '''
import os, signal, time
with open(os.environ["SPECDASH_SGLANG_ERROR_FILE"], "w") as f:
    f.write("ValueError: weights on fire in layer 3")
os.kill(os.getppid(), signal.SIGQUIT)
time.sleep(120)
'''
ENGINES, CHILDREN = [], []

class StandInEngine:
    def __init__(self, **kw):
        self.kw = kw
        if threading.current_thread() is threading.main_thread():  # as SGLang's Engine does
            signal.signal(signal.SIGQUIT, kw["custom_sigquit_handler"])
        self.tokenizer_manager = type("TM", (), {"tokenizer": None})()
        ENGINES.append(self)

    def generate(self, **kw):
        CHILDREN.append(subprocess.Popen([sys.executable, "-c", SCHEDULER]))
        while True:  # SGLang's request wait: wakes now and then, never returns
            time.sleep(0.05)

    def collective_rpc(self, method, **kw):
        pass

    def shutdown(self):
        self.kw["shut"] = True

process.patched_engine_class = lambda: StandInEngine
preflight.check_startable = lambda options, engines: None
argv = ["--engine", "sglang", "--model", "/models/m", "--sglang-arg", "mem_fraction_static=0.3",
        "--sglang-shadow", "sequential", "--max-new-tokens", "4"]
"""

DASHBOARD_SCRIPT = (
    STAND_IN
    + r"""
from specdash.cli.dashboard import dashboard_app
from specdash.cli import build_parser
from specdash.ui.widgets.help_screen import HelpScreen

async def main():
    before = signal.getsignal(signal.SIGQUIT)  # SIG_IGN when the test run is a background job
    app = dashboard_app(build_parser().parse_args(argv))
    app.source._telemetry = False
    async with app.run_test(size=(160, 48)) as pilot:
        deadline = time.monotonic() + 60
        while not app.model.errors and time.monotonic() < deadline:
            await pilot.pause(0.1)
        await pilot.pause(0.3)
        installed = signal.getsignal(signal.SIGQUIT) == app.source._fatal._on_sigquit
        error_panel = str(app.query_one("#error").render())
        engine_ended = not app.source.running
        await pilot.press("question_mark")  # the dashboard is alive and answers keys
        help_opened = isinstance(app.screen, HelpScreen)
        await pilot.press("escape", "q")
    return {
        "errors": [e.message for e in app.model.errors],
        "error_panel": error_panel,
        "installed": installed,
        "engine_ended": engine_ended,
        "help_opened": help_opened,
        "return_code": app.return_code,
        "restored": signal.getsignal(signal.SIGQUIT) == before,
        "child_exit": CHILDREN[0].wait(timeout=10),
        "engine_kw": {k: ENGINES[0].kw.get(k) for k in ("mem_fraction_static", "shut")},
    }

print("RESULT " + json.dumps(asyncio.run(main())))
"""
)


def test_scheduler_death_under_the_dashboard(run_sglang, tmp_path) -> None:
    proc = run_sglang(DASHBOARD_SCRIPT, env={"HOME": str(tmp_path)})
    r = json.loads(next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))[7:])
    assert r["errors"] == ["SchedulerFailed: ValueError: weights on fire in layer 3"]
    assert "weights on fire" in r["error_panel"] and "session over" in r["error_panel"]
    assert r["installed"] and r["restored"]  # the handler lives exactly as long as the session
    assert r["engine_ended"] and r["engine_kw"] == {"mem_fraction_static": 0.3, "shut": True}
    assert r["child_exit"] == -9  # SGLang's kill_process_tree took the scheduler down
    assert r["help_opened"] and r["return_code"] == 0


HEADLESS_SCRIPT = (
    STAND_IN
    + r"""
from specdash.cli import main
code = main(["run", "--headless", *argv])
print("RESULT " + json.dumps({"code": code, "children": [c.wait(timeout=10) for c in CHILDREN],
                              "shut": ENGINES[0].kw.get("shut")}))
"""
)


def test_scheduler_death_headless_is_one_line_and_exit_4(run_sglang, tmp_path) -> None:
    proc = run_sglang(HEADLESS_SCRIPT, env={"HOME": str(tmp_path)})
    r = json.loads(next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))[7:])
    assert r["code"] == 4 and r["children"] == [-9]
    assert "specdash: error: ValueError: weights on fire in layer 3" in proc.stderr
    assert "Traceback" not in proc.stderr
