"""The start-log lines StartWatch reads are what the real 0.5.17 and 0.5.23 wheels write: each
message template is in the wheel's source, and the line it formats to is read as its phase."""

from __future__ import annotations

import pytest

from specdash.runs.sglang.start import phase_of

# (template in SGLang's source, that line as formatted, the phase read from it)
LINES = [
    (
        'f"Load weight begin. avail mem=',
        "[2026-12-04 10:00:00 TP0] Load weight begin. avail mem=138.10 GB",
        ("load weights", None, None),
    ),
    (
        'f"Load weight end. "',
        "[2026-12-04 10:00:01 TP0] Load weight end. elapsed=0.41 s, type=Qwen3_5ForCausalLM",
        ("allocate KV cache", None, None),
    ),
    (
        'f"Capture {capture_name} {graph_backend[model_runner.device]} begin. "',
        "[2026-12-04 10:00:02 TP0] Capture target verify CUDA graph begin. backend=full, "
        "num_tokens_per_req=4, bs=[1], avail mem=68.90 GB",
        ("capture target verify CUDA graphs", None, None),
    ),
    (
        'f"Capture {capture_name} CUDA graph begin. "',
        "[2026-12-04 10:00:02 TP0] Capture target prefill CUDA graph begin. "
        "backend=tc_piecewise, num_tokens=[8192], avail mem=68.90 GB",
        ("capture target prefill CUDA graphs", None, None),
    ),
    (
        'f"Capture draft decode CUDA graph begin. backend={decode_backend}, "',
        "[2026-12-04 10:00:03 TP0] Capture draft decode CUDA graph begin. backend=triton, ",
        ("capture draft decode CUDA graphs", None, None),
    ),
    (
        'f"Capture draft extend CUDA graph begin. backend={decode_backend}, "',
        "[2026-12-04 10:00:04 TP0] Capture draft extend CUDA graph begin. backend=triton, ",
        ("capture draft extend CUDA graphs", None, None),
    ),
    (
        'f"Capturing batches ({bs=} {avail_mem=:.2f} GB)"',
        "Capturing batches (bs=1 avail_mem=68.09 GB): 100%|██████████| 2/2 [00:00<00:00]",
        ("capture (batch sizes)", 2, 2),
    ),
]


@pytest.mark.parametrize(("template", "line", "phase"), LINES)
def test_start_line_is_in_the_wheel_and_read_as_its_phase(
    run_each_sglang, template: str, line: str, phase: tuple[str, int | None, int | None]
) -> None:
    srt = run_each_sglang.wheel / "sglang" / "srt"
    assert any(template in p.read_text(encoding="utf-8") for p in srt.rglob("*.py")), template
    assert phase_of(line, None) == phase
