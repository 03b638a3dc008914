"""Traces: JSONL record and read, replay, export, report, diff. No Textual."""
