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
