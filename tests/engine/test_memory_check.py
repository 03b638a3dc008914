"""A preset whose weights cannot fit is refused before anything is built: one line with the
memory needed and available, exit 4 (environment), on the CPU and on a GPU."""

from __future__ import annotations

import time

import pytest
import torch

from specdash.cli import main
from specdash.engine import memory
from specdash.engine.config import preset
from specdash.errors import EXIT_ENVIRONMENT, EnvironmentProblem


def test_the_27b_shape_is_refused_up_front_on_this_cpu(capsys, monkeypatch):
    monkeypatch.setattr(memory, "available_bytes", lambda device: 24 * 10**9)  # a 24 GB box
    t0 = time.monotonic()
    code = main(["run", "--headless", "--preset", "qwen3.5-27b-shape", "--drafter", "ngram"])
    assert code == EXIT_ENVIRONMENT and time.monotonic() - t0 < 30
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("specdash: error: ")
    needed = preset("qwen3.5-27b-shape").num_params() * 4 / 1e9
    assert f"{needed:.1f} GB" in err and "24.0 GB available" in err and "float32" in err


def test_the_gpu_check_asks_the_device(monkeypatch):
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (10 * 2**30, 80 * 2**30))
    cuda = torch.device("cuda:0")
    assert memory.available_bytes(cuda) == 10 * 2**30
    needed = preset("qwen3.5-27b-shape").num_params() * 2 / 1e9
    with pytest.raises(
        EnvironmentProblem, match=rf"needs {needed:.1f} GB .* cuda:0 has 10\.7 GB free"
    ):
        memory.require_room("--preset qwen3.5-27b-shape", preset("qwen3.5-27b-shape"),
                            torch.bfloat16, cuda)  # fmt: skip
    memory.require_room("--preset tiny-hybrid", preset("tiny-hybrid"), torch.bfloat16, cuda)


def test_cpu_available_memory_is_read_from_the_system():
    assert memory.available_bytes(torch.device("cpu")) > 0


def test_the_fp8_preset_is_counted_in_fp8_bytes_on_a_gpu(monkeypatch):
    """On CUDA the FP8 preset keeps its linears in FP8 (one byte, plus a float32 scale per
    128 x 128 block) beside bf16 embedding, lm_head and GDN b|a: about 30 GB, which an 80 GB
    card holds and a 24 GB one does not; on the CPU it is dequantized, so counted in fp32."""
    cfg = preset("qwen3.5-27b-shape-fp8")
    cuda = torch.device("cuda:0")
    fp8_bytes = memory.weight_bytes(cfg, torch.bfloat16, cuda)
    embed_and_head = 2 * cfg.vocab_size * cfg.hidden_size * 2
    assert 24.2e9 < fp8_bytes - embed_and_head < 24.5e9  # 24.3 G FP8 linears, scales, b|a, norms
    assert memory.weight_bytes(cfg, torch.float32, torch.device("cpu")) == cfg.num_params() * 4
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (24 * 10**9, 0))
    with pytest.raises(EnvironmentProblem, match=rf"needs {fp8_bytes / 1e9:.1f} GB for its FP8"):
        memory.require_room("--preset qwen3.5-27b-shape-fp8", cfg, torch.bfloat16, cuda)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (79 * 10**9, 0))
    memory.require_room("--preset qwen3.5-27b-shape-fp8", cfg, torch.bfloat16, cuda)
