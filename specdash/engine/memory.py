"""Whether a model's weights fit on the device they are to be built on, asked before building
them: a shape preset too large for the machine is refused in one line instead of being killed
by the kernel minutes later."""

from __future__ import annotations

import math
import os

import torch

from specdash.engine.config import ModelConfig
from specdash.engine.model import hf_tensor_shapes
from specdash.errors import EnvironmentProblem


def available_bytes(device: torch.device) -> int:
    """Memory a new allocation can get: the GPU's free memory, or the system's available
    memory (Linux `MemAvailable`: free plus what the page cache gives back)."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def weight_bytes(cfg: ModelConfig, dtype: torch.dtype, device: torch.device) -> int:
    """Bytes of `cfg`'s weights on `device`: in `dtype`, a block-FP8 model's FP8 weights one
    byte each and their scales four where CUDA keeps them so (elsewhere they are dequantized)."""
    size = torch.empty((), dtype=dtype).element_size()
    q = cfg.quantization
    if q is None or device.type != "cuda":
        return cfg.num_params() * size
    total = 0
    for name, shape in hf_tensor_shapes(cfg).items():
        n = math.prod(shape)
        total += n * (4 if name.endswith("_scale_inv") else 1 if q.quantizes(name) else size)
    return total


def require_room(what: str, cfg: ModelConfig, dtype: torch.dtype, device: torch.device) -> None:
    """Refuse (`EnvironmentProblem`, exit 4) when `cfg`'s weights alone exceed what `device`
    has; building them needs at least that much."""
    needed = weight_bytes(cfg, dtype, device)
    have = available_bytes(device)
    if needed > have:
        fp8 = cfg.quantization is not None and device.type == "cuda"
        kind = "FP8" if fp8 else str(dtype).removeprefix("torch.")
        where = f"{device} has {have / 1e9:.1f} GB " + ("free" if device.type == "cuda" else
                                                        "available")  # fmt: skip
        raise EnvironmentProblem(
            f"{what} needs {needed / 1e9:.1f} GB for its {kind} weights and {where}"
        )
