"""Which quantization settings reach SGLang: those proven exact at every batch, refused up front
otherwise, in one line that says why and what works instead.

Exact (docs/exactness.md, measured on a GPU, docs/PERF.md): online FP8 (`quantization=fp8` on
a bf16 checkpoint, per-channel W8A8) and block-FP8 checkpoints with `weight_block_size`
[128, 128], both through `fp8_routing` (decode and verify on specdash's FP8 tile, prefill on
SGLang's kernels pinned to one configuration for every M); `kv_cache_dtype=fp8_e4m3` (a static
per-layer scale, elementwise, so batch-invariant). Refused: AWQ/GPTQ/Marlin int4 (Marlin splits
K across CTAs by M and, on sm_90, reduces with atomicAdd: batch-variant and run-to-run
nondeterministic), `w8a8_fp8` (it reaches the same `apply_fp8_linear` as online FP8, but has
never run on a GPU here, and no setting reaches an engine on reasoning alone), and every other
setting nobody has tested.

Checkpoint problems are checked from config.json and the safetensors headers alone (no tensor is
read): a block size the kernels do not run, an FP8 weight without its scale or with a scale of
the wrong shape. A card below sm_89 has no FP8 tensor cores: SGLang would fall back to Marlin's
W8A16, which is the batch-variant kernel above.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from safetensors import safe_open

from specdash.errors import CheckpointError, EnvironmentProblem, UsageError

EXACT_QUANTIZATION = ("fp8",)
"""`quantization` values whose GEMMs `fp8_routing` keeps batch-invariant."""
EXACT_KV_CACHE = ("auto", "bf16", "bfloat16", "fp8_e4m3")
EXACT_FP8_GEMM_BACKEND = ("auto",)
"""`fp8_gemm_runner_backend`: auto is the path measured (CUTLASS per-channel, Triton block)."""
FP8_BLOCK = [128, 128]
MARLIN = ("awq", "awq_marlin", "gptq", "gptq_marlin", "marlin", "moe_wna16", "gptq_marlin_24")
FP8_MIN_CAPABILITY = (8, 9)
INSTEAD = (
    "exact quantizations: --sglang-arg quantization=fp8 (online, on a bf16 checkpoint), "
    "a block-FP8 [128, 128] checkpoint, kv_cache_dtype=fp8_e4m3"
)
UNTESTED_ARGS = ("modelopt_quant", "torchao_config", "quantization_param_path")
"""Engine arguments that quantize by other means; any value is untested."""


def _why(setting: str, value: Any) -> str:
    if str(value).lower() in MARLIN or "marlin" in str(value).lower():
        reason = (
            "SGLang runs it on Marlin int4 kernels, which split K across CTAs by batch size and "
            "reduce with atomicAdd, so a row's bits depend on its batch (and on the run)"
        )
    elif str(value) == "w8a8_fp8":
        reason = (
            "its GEMMs are online FP8's (quantization=fp8 on a bf16 checkpoint is the same "
            "per-token x per-channel W8A8), but w8a8_fp8 itself is untested for bit-exactness"
        )
    else:
        reason = "untested for bit-exactness at every batch size"
    return f"{setting}={value}: {reason}; {INSTEAD}"


def argument_refusal(kwargs: dict[str, Any]) -> str | None:
    """Why these engine arguments quantize in a way not proven exact, or None."""
    for arg in ("quantization", "speculative_draft_model_quantization"):
        value = kwargs.get(arg)
        allowed = EXACT_QUANTIZATION + (("unquant",) if arg != "quantization" else ())
        if value is not None and value not in allowed:
            return _why(arg, value)
    kv = kwargs.get("kv_cache_dtype", "auto")
    if kv not in EXACT_KV_CACHE:
        return _why("kv_cache_dtype", kv)
    backend = kwargs.get("fp8_gemm_runner_backend", "auto")
    if backend not in EXACT_FP8_GEMM_BACKEND:
        return _why("fp8_gemm_runner_backend", backend)
    for arg in UNTESTED_ARGS:
        if kwargs.get(arg):
            return _why(arg, kwargs[arg])
    return None


def checkpoint_quantization(path: str | None) -> dict[str, Any] | None:
    """The `quantization_config` of the checkpoint at `path` (None: unquantized or no config)."""
    if not path:
        return None
    try:
        config = json.loads((Path(path) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    quant = config.get("quantization_config") or config.get("text_config", {}).get(
        "quantization_config"
    )
    return quant if isinstance(quant, dict) else None


def checkpoint_refusal(path: str | None) -> str | None:
    """Why the checkpoint's own quantization is not an exact one, or None (UsageError's text)."""
    quant = checkpoint_quantization(path)
    if quant is None:
        return None
    method = quant.get("quant_method")
    if method != "fp8" or quant.get("weight_block_size") is None:
        what = method if method != "fp8" else "fp8 without weight_block_size (per-tensor)"
        return f"{path}: {_why('quant_method', what)}"
    return None


def scale_problem(path: str | None) -> str | None:
    """What is wrong with a block-FP8 checkpoint's block size or scales (CheckpointError's
    text), or None; headers only."""
    quant = checkpoint_quantization(path)
    if quant is None or quant.get("quant_method") != "fp8" or path is None:
        return None
    block = quant.get("weight_block_size")
    if block is not None and list(block) != FP8_BLOCK:
        return (
            f"{path}: weight_block_size {block} is not supported (SGLang's block-FP8 kernels "
            f"run {FP8_BLOCK}; requantize with [128, 128])"
        )
    shapes = _fp8_tensors(Path(path))
    for name, (dtype, shape) in shapes.items():
        if dtype != "F8_E4M3" or not name.endswith(".weight") or block is None:
            continue
        scale = name.removesuffix(".weight") + ".weight_scale_inv"
        want = [math.ceil(shape[0] / block[0]), math.ceil(shape[1] / block[1])]
        if scale not in shapes:
            return f"{path}: FP8 weight {name} has no {scale} (the per-block scales)"
        if shapes[scale][1] != want:
            return (
                f"{path}: {scale} has shape {shapes[scale][1]}, expected {want} "
                f"(ceil of {name}'s {shape} over the block {block})"
            )
    return None


def _fp8_tensors(directory: Path) -> dict[str, tuple[str, list[int]]]:
    """name -> (safetensors dtype, shape) of every tensor, read from the headers."""
    out: dict[str, tuple[str, list[int]]] = {}
    for file in sorted(directory.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as st:
            for name in st.keys():  # noqa: SIM118 (safe_open has no __iter__)
                s = st.get_slice(name)
                out[name] = (s.get_dtype(), list(s.get_shape()))
    return out


def uses_fp8(kwargs: dict[str, Any]) -> bool:
    return (
        kwargs.get("quantization") in EXACT_QUANTIZATION
        or kwargs.get("kv_cache_dtype") == "fp8_e4m3"
        or any(
            checkpoint_quantization(kwargs.get(path)) is not None
            for path in ("model_path", "speculative_draft_model_path")
        )
    )


def described(kwargs: dict[str, Any]) -> str | None:
    """The engine's quantization as the session header names it ("fp8 online", "fp8 block
    [128, 128] checkpoint", "w8a8_fp8", each with "+ kv_cache fp8_e4m3" where the KV cache is
    FP8 too); None: the weights and the cache run in the engine's dtype."""
    parts = []
    quant = checkpoint_quantization(kwargs.get("model_path"))
    if quant is not None:
        block = quant.get("weight_block_size")
        parts.append(f"{quant.get('quant_method')} block {list(block)} checkpoint" if block
                     else f"{quant.get('quant_method')} checkpoint")  # fmt: skip
    elif kwargs.get("quantization") is not None:
        method = kwargs["quantization"]
        parts.append(f"{method} online" if method == "fp8" else str(method))
    if kwargs.get("kv_cache_dtype", "auto") != "auto":
        parts.append(f"kv_cache {kwargs['kv_cache_dtype']}")
    return " + ".join(parts) or None


def check(kwargs: dict[str, Any]) -> None:
    """UsageError (exit 2) for a quantization not proven exact, CheckpointError (exit 3) for a
    block-FP8 checkpoint the kernels cannot run as written; before anything starts."""
    reason = argument_refusal(kwargs)
    if reason is not None:
        raise UsageError(reason, setting="engine_args")
    paths = (kwargs.get("model_path"), kwargs.get("speculative_draft_model_path"))
    for reason in map(checkpoint_refusal, paths):
        if reason is not None:
            raise UsageError(reason, setting="model")
    for path in paths:
        problem = scale_problem(path)
        if problem is not None:
            raise CheckpointError(problem, setting="model")


def check_card(kwargs: dict[str, Any], capability: tuple[int, int], name: str) -> None:
    """EnvironmentProblem (exit 4) for FP8 (`uses_fp8`) on a card without FP8 tensor cores."""
    if capability < FP8_MIN_CAPABILITY:
        major, minor = capability
        raise EnvironmentProblem(
            f"FP8 needs a GPU of compute capability 8.9 or newer (Ada, Hopper); {name} is "
            f"sm_{major}{minor}: SGLang would run FP8 there on Marlin's batch-variant W8A16 "
            "kernels; run this checkpoint in bf16 (no quantization) on this card",
            setting="engine",
        )
