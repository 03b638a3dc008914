"""`specdash [flags]` / `specdash run [flags]`: the dashboard over a live session."""

from __future__ import annotations

import argparse
import asyncio
import sys

from specdash.cli.headless import format_summary
from specdash.cli.session_args import describe, open_trace, session_options, settings_from_args
from specdash.cli.signals import Terminated, on_termination
from specdash.errors import EXIT_INTERRUPTED, FlagError
from specdash.ui.app import SpecdashApp
from specdash.ui.sources import LiveSession


def dashboard_app(args: argparse.Namespace) -> SpecdashApp:
    """The dashboard `specdash [flags]` asks for, not yet running: bad flags, bad SGLang
    options and an unwritable `--trace` fail here, before the UI takes the terminal."""
    settings = settings_from_args(args)
    options = session_options(settings, args)  # SGLang's output: a log file (the session's)
    writer = open_trace(settings)
    source = LiveSession(settings, engine_options=options, describe=describe)
    if settings.trace is None:
        return SpecdashApp(source)
    return SpecdashApp(source, settings.trace.parent, writer)


def run_dashboard(args: argparse.Namespace) -> int:
    """The dashboard until `q`, then the session's summary as headless prints it; the exit
    code (and one line on stderr) says how the session ended (`SpecdashApp.exit_code`)."""
    for flag in ("json", "fail_on_divergence"):  # `run`'s headless flags
        if getattr(args, flag, False):
            name = "--" + flag.replace("_", "-")
            raise FlagError(f"argument {name}: only with --headless (the dashboard shows it)")
    app = dashboard_app(args)
    terminated: list[Terminated] = []

    def end(signum: int) -> None:
        """SIGTERM or SIGHUP while the app runs: it quits as on Ctrl-C (the engine stopped,
        the trace closed, the terminal restored), from its own loop."""
        terminated.append(Terminated(signum))
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # not started yet, or already ended
            raise terminated[-1] from None
        loop.call_soon_threadsafe(app.exit, terminated[-1].exit_code)

    with on_termination(end):
        code = app.run() or 0
    if terminated:
        print(terminated[-1].line, file=sys.stderr)
        return terminated[-1].exit_code
    if app.model.summary is not None:
        print(format_summary(app.model.summary, list(app.model.divergences)))
    stopped = app.recorder.stopped  # e.g. the old trace kept, and where the partial one is
    if stopped is not None and stopped != app.exit_message:
        print(f"specdash: warning: {stopped}", file=sys.stderr)
    if code == EXIT_INTERRUPTED:
        print("specdash: interrupted", file=sys.stderr)
    elif code and app.exit_message:
        print(f"specdash: error: {app.exit_message}", file=sys.stderr)
    return code
