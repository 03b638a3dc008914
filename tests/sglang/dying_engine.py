"""A stand-in `sglang.Engine` whose scheduler dies mid-request the way SGLang's does (a child
process writes its reason and sends SIGQUIT to its parent), patched in on import, and `run`:
what the dashboard's engine process runs (it imports this module by name). On shutdown the
engine writes what it saw to `$WORKDIR/engine.json`."""

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from specdash.runs.runner import run_engine
from specdash.runs.sglang import preflight, process

SCHEDULER = """
import os, signal, time
with open(os.environ["SPECDASH_SGLANG_ERROR_FILE"], "w") as f:
    f.write("ValueError: weights on fire in layer 3")
os.kill(os.getppid(), signal.SIGQUIT)
time.sleep(120)
"""
CHILDREN = []


class StandInEngine:
    def __init__(self, **kw):
        self.kw = kw
        self.on_main_thread = threading.current_thread() is threading.main_thread()
        if self.on_main_thread:  # as SGLang's Engine does
            signal.signal(signal.SIGQUIT, kw["custom_sigquit_handler"])
        self.tokenizer_manager = type("TM", (), {"tokenizer": None})()

    def generate(self, **kw):
        CHILDREN.append(subprocess.Popen([sys.executable, "-c", SCHEDULER]))
        while True:  # SGLang's request wait: wakes now and then, never returns
            time.sleep(0.05)

    def collective_rpc(self, method, **kw):
        pass

    def shutdown(self):
        record = {
            "mem_fraction_static": self.kw.get("mem_fraction_static"),
            "on_main_thread": self.on_main_thread,
            "children": [c.wait(timeout=10) for c in CHILDREN],
            "pid": os.getpid(),
        }
        Path(os.environ["WORKDIR"], "engine.json").write_text(json.dumps(record))


process.patched_engine_class = lambda: StandInEngine
preflight.check_startable = lambda options, engines: None
argv = [
    "--engine",
    "sglang",
    "--model",
    "/models/m",
    "--sglang-arg",
    "mem_fraction_static=0.3",
    "--sglang-shadow",
    "sequential",
    "--max-new-tokens",
    "4",
]


def run(settings, sink, controls, stop, options):
    # not `run = run_engine`: pickled by name, that would import only the runner
    return run_engine(settings, sink, controls, stop, options)
