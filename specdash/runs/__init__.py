"""Runners: turn an engine into the event stream (native; SGLang's moves here)."""
