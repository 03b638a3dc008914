"""Weights into models: a session's target and draft from checkpoints, a preset or the embedded
tiny pair, on the session's device, dtype and GEMM backend. `load_models(settings)` is what a
native session, the audit, the benchmarks and the engine tests load with."""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import torch

from specdash.engine import memory
from specdash.engine.checkpoint import load_checkpoint
from specdash.engine.config import ModelConfig, config_from_hf, preset
from specdash.engine.model import Model
from specdash.engine.tokenizer import ByteTokenizer, TextTokenizer
from specdash.errors import CheckpointError, EnvironmentProblem, UsageError
from specdash.kernels import gemm_backends
from specdash.registry import drafters
from specdash.settings import SessionSettings

SMALL_MODEL_PARAMS = 50_000_000


def default_checkpoint(name: str) -> Path:
    """The embedded tiny pair shipped inside the package (`target`, `draft`)."""
    return Path(str(resources.files("specdash") / "data" / name))


@dataclass(slots=True)
class Loaded:
    target: Model
    draft: Model | None
    tokenizer: TextTokenizer
    eos_ids: list[int]
    description: dict[str, str]


def device_of(settings: SessionSettings) -> torch.device:
    """The session's device, refused (with the setting's name) when it is not one torch runs."""
    try:
        dev = torch.device(settings.device)
    except RuntimeError:
        raise UsageError(
            f"no device {settings.device!r}: expected cpu, cuda or cuda:N", setting="device"
        ) from None
    if dev.type not in ("cpu", "cuda"):
        raise UsageError(f"{settings.device!r}: only cpu and cuda are supported", setting="device")
    if dev.type == "cpu" and dev.index not in (None, 0):  # torch takes it, and runs on the CPU
        raise UsageError(
            f"{settings.device!r}: there is one CPU device (cpu); an index is for cuda:N",
            setting="device",
        )
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise EnvironmentProblem(
            f"{settings.device!r}: no CUDA device is available", setting="device"
        )
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        count = torch.cuda.device_count()
        names = ", ".join(f"cuda:{i}" for i in range(count))
        raise EnvironmentProblem(
            f"{settings.device!r}: torch sees {count} CUDA device{'s' * (count != 1)} ({names})",
            setting="device",
        )
    return dev


def _dtype(settings: SessionSettings, device: torch.device) -> torch.dtype:
    name = settings.dtype or ("bfloat16" if device.type == "cuda" else "float32")
    return getattr(torch, name)


def _load_one(
    path: Path | None,
    preset_name: str | None,
    dtype: torch.dtype,
    device: torch.device,
    gemm: gemm_backends.GemmBackend,
    seed: int,
    auto_gemm: bool = False,
) -> tuple[Model, TextTokenizer, list[int]]:
    if preset_name is not None:
        cfg = preset(preset_name)
        gemm = _fp8_gemm(cfg, gemm, auto_gemm, device)
        memory.require_room(f"--preset {preset_name}", cfg, dtype, device)
        return Model.random(cfg, seed, dtype, device, gemm), ByteTokenizer(cfg.vocab_size), []
    assert path is not None
    if device.type == "cuda":  # refuse the backend before reading gigabytes of weights
        gemm = _fp8_gemm(config_from_hf(path), gemm, auto_gemm, device)
    cfg, tensors, hf_tok = load_checkpoint(path, dtype, str(device))
    tok = TextTokenizer(hf_tok)
    if tok.vocab_size > cfg.vocab_size:
        raise CheckpointError(
            f"{path}: tokenizer has {tok.vocab_size} tokens but the model only {cfg.vocab_size}"
        )
    return Model.from_tensors(cfg, tensors, gemm, consume=True), tok, cfg.eos_token_ids


def _fp8_gemm(
    cfg: ModelConfig, gemm: gemm_backends.GemmBackend, auto: bool, device: torch.device
) -> gemm_backends.GemmBackend:
    """The backend a model of `cfg` runs on: `gemm`, or for FP8 weights on CUDA the one with
    FP8 GEMMs when the backend was left to `auto` (`triton-fp8`); a backend chosen by name that
    runs no FP8 weights is refused."""
    if cfg.quantization is None or device.type != "cuda" or gemm.fp8 is not None:
        return gemm
    if not auto:
        raise UsageError(
            f"--gemm-backend {gemm.name} runs no FP8 weights; this model is block FP8: "
            "use --gemm-backend triton-fp8 (or auto)",
            setting="gemm_backend",
        )
    return gemm_backends.resolve("triton-fp8", device)


def load_models(settings: SessionSettings) -> Loaded:
    device = device_of(settings)
    dtype = _dtype(settings, device)
    gemm = gemm_backends.resolve(settings.gemm_backend, device)
    target_path = settings.model
    if target_path is None and settings.preset is None:
        target_path = default_checkpoint("target")
        if not (target_path / "config.json").exists():
            raise CheckpointError(
                f"embedded default model missing at {target_path}; name a checkpoint",
                setting="model",
            )
    auto = settings.gemm_backend == "auto"
    target, tok, eos = _load_one(
        target_path, settings.preset, dtype, device, gemm, settings.seed, auto
    )
    if device.type == "cpu" and target.cfg.num_params() < SMALL_MODEL_PARAMS:
        # Small ops gain nothing from intra-op threads and lose a lot when cores are
        # shared (OpenMP barriers): measured 3.0 ms vs 22 ms per decode step under load.
        torch.set_num_threads(1)
    desc = {"model": str(target_path or settings.preset), "drafter": settings.drafter}
    loaded = Loaded(target, None, tok, eos, desc)
    if drafters.uses_draft_model(settings.drafter) and settings.speculation:
        load_draft(settings, loaded)
    return loaded


def load_draft(settings: SessionSettings, loaded: Loaded) -> None:
    """The draft model into `loaded` (at the start, or when speculation is switched on in a
    session that started without it), on the target's device, dtype and GEMM backend."""
    target = loaded.target
    draft_path = settings.draft
    if draft_path is None:
        if settings.model is not None or settings.preset is not None:
            raise UsageError(
                "the model drafter needs a draft checkpoint beside a target of its own "
                "(or use the n-gram drafter)",
                setting="draft",
            )
        draft_path = default_checkpoint("draft")
    draft, draft_tok, _ = _load_one(
        draft_path, None, target.dtype, target.device, target.gemm, settings.seed
    )
    target_path = loaded.description["model"]
    if draft_tok != loaded.tokenizer:
        raise CheckpointError(
            f"{draft_path}: draft tokenizer differs from the target's ({target_path})"
        )
    if draft.cfg.vocab_size > target.cfg.vocab_size:
        # its extra ids have no row in the target's embedding: a draft of one would end
        # the session mid-decode
        raise CheckpointError(
            f"{draft_path}: the draft's vocabulary ({draft.cfg.vocab_size} ids) is larger "
            f"than the target's ({target.cfg.vocab_size}, {target_path})"
        )
    loaded.draft = draft
    loaded.description["draft"] = str(draft_path)
