"""Whether a model's weights fit on the device they are to be built on, asked before building
them: a shape preset too large for the machine is refused in one line instead of being killed
by the kernel minutes later."""

from __future__ import annotations

import os

import torch

from specdash.engine.config import ModelConfig
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


def require_room(what: str, cfg: ModelConfig, dtype: torch.dtype, device: torch.device) -> None:
    """Refuse (`EnvironmentProblem`, exit 4) when `cfg`'s weights in `dtype` alone exceed what
    `device` has; building them needs at least that much."""
    needed = cfg.num_params() * torch.empty((), dtype=dtype).element_size()
    have = available_bytes(device)
    if needed > have:
        where = f"{device} has {have / 1e9:.1f} GB " + ("free" if device.type == "cuda" else
                                                        "available")  # fmt: skip
        raise EnvironmentProblem(
            f"{what} needs {needed / 1e9:.1f} GB for its {str(dtype).removeprefix('torch.')} "
            f"weights and {where}"
        )
