"""Hugging Face-format checkpoints in and out: config.json, (sharded) safetensors, tokenizer.json.

Every way a checkpoint can be wrong ends in one `CheckpointError` line naming the file
and the tensor, never a traceback from safetensors or tokenizers. A block-FP8 checkpoint's
weights stay FP8 on CUDA (the FP8 tile runs them) and are dequantized exactly elsewhere
(`weights.dequantize_fp8`).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from tokenizers import Tokenizer

from specdash.engine.config import ModelConfig, config_from_hf, read_json, save_hf_config
from specdash.engine.model import hf_tensor_shapes
from specdash.engine.weights import SCALE_SUFFIX, dequantize_fp8
from specdash.errors import CheckpointError
from specdash.kernels.fp8 import BLOCK, FP8

INDEX = "model.safetensors.index.json"


def _shard_files(path: Path) -> dict[str, Path]:
    """Tensor name -> shard file, from the index when there is one."""
    index = path / INDEX
    try:
        loaded = read_json(index, "the shard index")
    except FileNotFoundError:
        loaded = None
    if loaded is not None:
        weight_map = loaded.get("weight_map") if isinstance(loaded, dict) else None
        if not isinstance(weight_map, dict) or not all(
            isinstance(f, str) for f in weight_map.values()
        ):
            raise CheckpointError(
                f'{index}: unreadable index (expected "weight_map": an object of tensor name '
                "-> shard file name)"
            )
        return {name: path / f for name, f in weight_map.items()}
    single = path / "model.safetensors"
    if not single.exists():
        raise CheckpointError(f"{path}: no model.safetensors or {INDEX}")
    _check_readable(single)
    try:
        with safe_open(single, "pt") as f:
            return {name: single for name in f.keys()}  # noqa: SIM118 (safe_open has no __iter__)
    except (SafetensorError, OSError) as e:
        raise CheckpointError(f"{single}: corrupt safetensors file ({e})") from None


def _check_readable(file: Path) -> None:
    """A safetensors file that is not a readable regular file, said as such: safetensors'
    own errors would call it corrupt, or missing."""
    try:
        with open(file, "rb"):
            pass
    except IsADirectoryError:
        raise CheckpointError(f"{file}: is a directory, not a safetensors file") from None
    except OSError as e:
        raise CheckpointError(f"{file}: cannot read ({e.strerror or e})") from None


def _refuse_unread_layers(path: Path, cfg: ModelConfig, files: dict[str, Path]) -> None:
    """Weights of a layer past `num_hidden_layers`: config.json under-reports the model, which
    would run with its last layers left out."""
    layers = re.compile(rf"{re.escape(cfg.weight_prefix)}layers\.(\d+)\.")
    found = {int(m.group(1)) for name in files if (m := layers.match(name))}
    extra = sorted(i for i in found if i >= cfg.num_hidden_layers)
    if extra:
        raise CheckpointError(
            f"{path}: the weights hold layers up to {extra[-1]}, but config.json's "
            f"num_hidden_layers is {cfg.num_hidden_layers}"
        )


def load_tensors(
    path: Path, cfg: ModelConfig, dtype: torch.dtype, device: str
) -> dict[str, torch.Tensor]:
    expected = hf_tensor_shapes(cfg)
    files = _shard_files(path)
    missing = [n for n in expected if n not in files]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise CheckpointError(f"{path}: missing tensor {missing[0]}{more}")
    _refuse_unread_layers(path, cfg, files)
    by_file: dict[Path, list[str]] = {}
    for name in expected:
        by_file.setdefault(files[name], []).append(name)
    out = {}
    for file, names in by_file.items():
        if not file.exists():
            raise CheckpointError(f"{file}: shard listed in the index is missing")
        _check_readable(file)
        try:
            with safe_open(file, "pt", device="cpu") as f:
                for name in names:
                    t = f.get_tensor(name)
                    if not t.dtype.is_floating_point:  # a cast would make up the weights
                        raise CheckpointError(f"{file}: {name} holds {t.dtype}, not floats")
                    if tuple(t.shape) != expected[name]:
                        raise CheckpointError(
                            f"{file}: {name} has shape {tuple(t.shape)}, "
                            f"{path / 'config.json'} implies {expected[name]}"
                        )
                    out[name] = _on_device(t, name, cfg, dtype, device, file)
                    _refuse_non_finite(out[name], name, file)
        except (SafetensorError, OSError, RuntimeError) as e:
            raise CheckpointError(f"{file}: corrupt safetensors file ({e})") from None
    if cfg.quantization is not None and not device.startswith("cuda"):
        dequantize_fp8(out, dtype)
    return out


def _on_device(
    t: torch.Tensor, name: str, cfg: ModelConfig, dtype: torch.dtype, device: str, file: Path
) -> torch.Tensor:
    """Tensor `name` as the model takes it: in `dtype`, or an FP8 weight as stored (its scales
    in float32), each checked against what quantization_config says it is."""
    if name.endswith(SCALE_SUFFIX):
        if not t.is_floating_point():
            raise CheckpointError(f"{file}: {name} is {t.dtype}, not a float scale")
        return t.to(device=device, dtype=torch.float32)
    if cfg.quantization is None or not cfg.quantization.quantizes(name):
        return t.to(device=device, dtype=dtype)
    if t.dtype != FP8:
        raise CheckpointError(
            f"{file}: {name} is {str(t.dtype).removeprefix('torch.')}; its quantization_config "
            "makes it float8_e4m3fn (or name it in modules_to_not_convert)"
        )
    if device.startswith("cuda") and t.shape[1] % BLOCK:
        raise CheckpointError(
            f"{file}: {name} has K={t.shape[1]}, not a multiple of {BLOCK}, which the FP8 GEMM "
            "steps through (on the CPU it is dequantized)"
        )
    return t.to(device=device)


def _refuse_non_finite(t: torch.Tensor, name: str, file: Path) -> None:
    """A NaN or an infinity in a weight, as the model holds it (after the cast to its dtype,
    which can overflow): it would run and decode garbage, each output as exact as the other.
    An FP8 weight has no infinity, and its NaN is every exponent and mantissa bit set."""
    if t.dtype == FP8:
        bad = bool(((t.view(torch.uint8) & 0x7F) == 0x7F).any())
    else:
        bad = not bool(torch.isfinite(t).all())
    if bad:
        dtype = str(t.dtype).removeprefix("torch.")
        raise CheckpointError(f"{file}: {name} holds NaN or infinite values (as {dtype})")


SCAN_ELEMENTS = 1 << 26
"""Elements read at a time by `refuse_non_finite_weights` (256 MB as fp32): its memory bound."""


def refuse_non_finite_weights(path: Path) -> None:
    """CheckpointError for the first float tensor of the checkpoint at `path` that holds a NaN
    or an infinity, read from disk in slices of rows: for an engine that loads the weights
    itself (SGLang), so nothing of its own is checked before it starts. Costs one read of the
    weights (the page cache then serves the engine's own)."""
    for file in sorted(set(_shard_files(path).values())):
        _check_readable(file)
        try:
            with safe_open(file, "pt", device="cpu") as f:
                for name in f.keys():  # noqa: SIM118 (safe_open has no __iter__)
                    part = f.get_slice(name)
                    shape = part.get_shape()
                    if not shape:
                        _refuse_non_finite_float(f.get_tensor(name), name, file)
                        continue
                    row = max(1, math.prod(shape[1:]))
                    step = max(1, SCAN_ELEMENTS // row)
                    for start in range(0, shape[0], step):
                        _refuse_non_finite_float(part[start : start + step], name, file)
        except (SafetensorError, OSError, RuntimeError) as e:
            raise CheckpointError(f"{file}: corrupt safetensors file ({e})") from None


def _refuse_non_finite_float(t: torch.Tensor, name: str, file: Path) -> None:
    if t.dtype.is_floating_point:  # integer tensors (an index, a count) have no NaN
        _refuse_non_finite(t, name, file)


def load_tokenizer(path: Path) -> Tokenizer:
    file = path / "tokenizer.json"
    if not file.exists():
        raise CheckpointError(f"{path}: no tokenizer.json")
    try:
        return Tokenizer.from_file(str(file))
    except Exception as e:  # tokenizers raises a bare Exception on malformed files
        raise CheckpointError(f"{file}: unreadable tokenizer ({str(e).splitlines()[0]})") from None


def load_checkpoint(
    path: Path, dtype: torch.dtype, device: str
) -> tuple[ModelConfig, dict[str, torch.Tensor], Tokenizer]:
    if not path.is_dir():
        raise CheckpointError(f"{path}: checkpoint directory does not exist")
    cfg = config_from_hf(path)
    return cfg, load_tensors(path, cfg, dtype, device), load_tokenizer(path)


def save_checkpoint(
    path: Path,
    cfg: ModelConfig,
    tensors: dict[str, torch.Tensor],
    tokenizer: Tokenizer | None = None,
    max_shard_bytes: int | None = None,
) -> None:
    """Write config.json + safetensors (sharded with an index past `max_shard_bytes`)."""
    save_hf_config(cfg, path)
    tensors = {n: t.detach().contiguous().cpu() for n, t in tensors.items()}
    if max_shard_bytes is None:
        save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    else:
        shards: list[dict[str, torch.Tensor]] = [{}]
        size = 0
        for name, t in tensors.items():
            nbytes = t.numel() * t.element_size()
            if shards[-1] and size + nbytes > max_shard_bytes:
                shards.append({})
                size = 0
            shards[-1][name] = t
            size += nbytes
        weight_map: dict[str, str] = {}
        for i, shard in enumerate(shards):
            fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
            save_file(shard, str(path / fname), metadata={"format": "pt"})
            weight_map |= {n: fname for n in shard}
        total = sum(t.numel() * t.element_size() for t in tensors.values())
        (path / INDEX).write_text(
            json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1)
        )
    if tokenizer is not None:
        tokenizer.save(str(path / "tokenizer.json"))
