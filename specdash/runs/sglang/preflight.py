"""Why SGLang cannot start a configuration, and what to do, in one line: said before any engine
starts where the settings alone tell (a kernel package the box lacks, more GPUs than it has),
and read from the traceback of a scheduler that died where they do not.

Why before: an SGLang start costs a minute or more (processes, weights, graph captures) before
it fails on a missing kernel module, and then reports only the module's name.
"""

from __future__ import annotations

import importlib.util
import os
import re
from pathlib import Path
from typing import Any

from specdash.errors import EnvironmentProblem, UsageError
from specdash.registry.algorithms import NAMES as ALGORITHMS
from specdash.runs.sglang import algorithms, quantization
from specdash.runs.sglang.args import SGLangOptions, applied_patches


def module_missing(name: str) -> bool:
    """True when `name` cannot be found; its package is imported to look (sgl_kernel: ~1 s)."""
    try:
        return importlib.util.find_spec(name) is None
    except (ImportError, ValueError):  # the parent package is missing or broken
        return True


# (engine argument, its value, the module it needs, what that module is, what to do instead)
NEEDS: tuple[tuple[str, str, str, str, str], ...] = (
    (
        "attention_backend",
        "fa3",
        "sgl_kernel.flash_ops",
        "sgl_kernel's FA3 kernels",
        "use attention_backend=triton (specdash's default)",
    ),
    (
        "attention_backend",
        "flashinfer",
        "flashinfer",
        "FlashInfer",
        "use attention_backend=triton (specdash's default)",
    ),
)


def refusal(kwargs: dict[str, Any], gpus: int) -> str | None:
    """Why these `sglang.Engine` arguments cannot start on this machine, or None."""
    tp = int(kwargs.get("tp_size") or 1)
    if tp > gpus:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        where = f" (CUDA_VISIBLE_DEVICES={visible})" if visible is not None else ""
        return (
            f"tp_size={tp} needs {tp} GPUs; torch sees {gpus}{where}: "
            f"use --sglang-arg tp_size={gpus} or a machine with {tp} GPUs"
        )
    for arg, value, module, what, instead in NEEDS:
        if kwargs.get(arg) == value and module_missing(module):
            return (
                f"{arg}={value} needs {what} (Python module {module!r}), "
                f"which this SGLang install lacks: {instead}"
            )
    return None


def check_can_start(kwargs: dict[str, Any], gpus: int) -> None:
    """EnvironmentProblem (exit 4) for a configuration this machine cannot start."""
    reason = refusal(kwargs, gpus)
    if reason is not None:
        raise EnvironmentProblem(f"sglang cannot start here: {reason}")


def check_startable(options: SGLangOptions, engines: list[dict[str, Any]]) -> str:
    """Install hint, the algorithm (its name, and whether the checkpoints and the installed
    SGLang can run it: `algorithms`), the quantization (exact or refused: `quantization`), CUDA,
    FP8 on this card, patch targets, whether each engine's arguments (`engines`, the
    speculative engine's first) can start on this machine and finite weights, before anything
    is started; the release row whose patches apply (`check.ensure_patchable`)."""
    from specdash.runs.sglang.patches.check import ensure_patchable, require_sglang

    require_sglang()
    if options.speculative_algorithm not in ALGORITHMS:
        raise UsageError(
            f"{options.speculative_algorithm!r}: one of {', '.join(ALGORITHMS)}",
            setting="speculative_algorithm",
        )
    # the speculative engine's, or the plain one's
    reason = algorithms.refusal(engines[0], applied_patches(options))
    if reason is not None:
        raise UsageError(reason, setting="speculative_algorithm")
    for kwargs in engines:
        quantization.check(kwargs)
    import torch

    if not torch.cuda.is_available():
        raise EnvironmentProblem(
            "the SGLang engine needs a CUDA GPU; none is visible to torch", setting="engine"
        )
    row = ensure_patchable(options.force_patches)
    for kwargs in engines:
        if quantization.uses_fp8(kwargs):  # the card is asked only when it matters
            card = torch.cuda.get_device_capability(), torch.cuda.get_device_name()
            quantization.check_card(kwargs, *card)
        check_can_start(kwargs, torch.cuda.device_count())
    _refuse_non_finite_checkpoints(engines)  # last: it reads every weight
    return row


def _refuse_non_finite_checkpoints(engines: list[dict[str, Any]]) -> None:
    """CheckpointError (exit 3) for NaN or infinite weights in a checkpoint the engines load
    (each once: the shadow's target is the speculative engine's, NEXTN's draft its target).
    SGLang would load and decode them, every output as exact as its shadow and all of them
    garbage. Dummy weights (`load_format=dummy`) have no file to read."""
    from specdash.engine.checkpoint import refuse_non_finite_weights

    checkpoints = (
        ("model_path", "load_format"),
        ("speculative_draft_model_path", "speculative_draft_load_format"),
    )
    paths = {
        Path(kwargs[path_arg])
        for kwargs in engines
        for path_arg, format_arg in checkpoints
        if kwargs.get(path_arg) and kwargs.get(format_arg) != "dummy"
    }
    for path in sorted(p for p in paths if p.is_dir()):
        refuse_non_finite_weights(path)


_FRAME = re.compile(r'File "(?P<file>[^"]+)", line \d+, in (?P<func>\S+)')
_MISSING = re.compile(r"No module named '(?P<module>[\w.]+)'")
_CAPTURE = re.compile(r"cuda_graph|capture", re.IGNORECASE)


def _sglang_module(path: str) -> str | None:
    """'.../site-packages/sglang/srt/layers/x.py' -> 'sglang.srt.layers.x'."""
    parts = path.replace("\\", "/").split("/")
    if "sglang" not in parts or not path.endswith(".py"):
        return None
    tail = parts[len(parts) - 1 - parts[::-1].index("sglang") :]
    return ".".join(tail)[: -len(".py")]


def last_line(text: str) -> str:
    """The last non-blank line of `text`, stripped (a traceback's exception line)."""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else text.strip()


def explain_failure(traceback_text: str) -> str:
    """A dead scheduler's traceback as one line: its last line and, for a missing module,
    which SGLang module imported it and what avoids it."""
    last = last_line(traceback_text)
    missing = _MISSING.search(last)
    if missing is None:
        return last
    frames = [m for ln in traceback_text.splitlines() if (m := _FRAME.search(ln))]
    importer = next(
        (mod for m in reversed(frames) if (mod := _sglang_module(m["file"])) is not None), None
    )
    by = f", imported by {importer}" if importer else ""
    line = f"{last}{by}"
    if any(_CAPTURE.search(m["file"]) or _CAPTURE.search(m["func"]) for m in frames):
        line += (
            "; SGLang imports it while capturing CUDA graphs: install "
            f"{missing['module']}, or --sglang-arg disable_cuda_graph=true avoids the import"
        )
    else:
        line += f"; install {missing['module']} or choose settings that do not need it"
    return line
