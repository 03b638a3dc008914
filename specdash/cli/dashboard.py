"""`specdash [flags]` / `specdash run [flags]`: the dashboard over a live session."""

from __future__ import annotations

import argparse
import dataclasses
import sys

from specdash.cli.session_args import session_options, settings_from_args
from specdash.runs.sglang import log_file_beside
from specdash.trace.jsonl import TraceWriter
from specdash.ui.app import SpecdashApp
from specdash.ui.sources import LiveSession


def dashboard_app(args: argparse.Namespace) -> SpecdashApp:
    """The dashboard `specdash [flags]` asks for, not yet running: bad flags, bad SGLang
    options and an unwritable `--trace` fail here, before the UI takes the terminal."""
    settings = settings_from_args(args)
    options = session_options(settings, args)
    if options is not None:  # the TUI owns the terminal: SGLang's processes write to a file
        options = dataclasses.replace(options, log_file=log_file_beside(settings))
    source = LiveSession(settings, sglang_options=options)
    if settings.trace is None:
        return SpecdashApp(source)
    writer = TraceWriter(settings.trace, overwrite=settings.overwrite_trace)
    return SpecdashApp(source, settings.trace.parent, writer)


def run_dashboard(args: argparse.Namespace) -> int:
    """The dashboard until `q`; the exit code (and one line on stderr) says how the session
    ended (`SpecdashApp.exit_code`)."""
    app = dashboard_app(args)
    code = app.run() or 0
    if code and app.exit_message:
        print(f"specdash: error: {app.exit_message}", file=sys.stderr)
    return code
