"""SGLang backend: a patched `sglang.Engine` in-process, speaking specdash's event stream.

args.py       what specdash asks of `sglang.Engine` (the engine-argument policy), SGLangOptions
preflight.py  why a configuration cannot start, in one line, before it starts or after it died
process.py    SGLang's processes: the patched engine class, the child entries, output and
              environment (the one place settings cross into SGLang's processes), a
              scheduler's death reaching the session
host.py       EngineHost: the shadow engine in a process of its own, so both start at once
start.py      StartWatch: an engine's start phases read from SGLang's log
telemetry.py  the scheduler's per-step telemetry as VerifyStep events
backend.py    SGLangBackend: the session's backend
"""
