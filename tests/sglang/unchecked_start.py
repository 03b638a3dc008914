"""`run`: `run_engine` with SGLang's preflight check off (no CUDA here: it would refuse before
the start under test), for the dashboard's engine process, which imports this module by name."""

from specdash.runs.runner import run_engine
from specdash.runs.sglang import preflight

preflight.check_startable = lambda options, engines: None


def run(settings, sink, controls, stop, options):
    # not `run = run_engine`: pickled by name, that would import only the runner
    return run_engine(settings, sink, controls, stop, options)
