"""What specdash asks of `sglang.Engine`: the keyword arguments of each engine of a session.

Defaults make greedy speculative output comparable bit for bit with plain decoding:
deterministic inference, Triton attention and Triton GDN kernels, fp32 SSM state, chain
drafts (topk=1). Every `sglang.Engine` argument can still be overridden (`--sglang-arg
key=value`). The shadow run (no speculation) is a second engine on the same weights with
the GPU memory split between the two, or, when memory is short, runs after the speculative
engine has shut down (`sequential`).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from specdash.errors import UsageError
from specdash.registry import algorithms
from specdash.runs.sglang.patches.registry import patch_row
from specdash.settings import SessionSettings

EXACT_DEFAULTS: dict[str, Any] = {
    "enable_deterministic_inference": True,
    "attention_backend": "triton",
    "linear_attn_backend": "triton",
    "mamba_ssm_dtype": "float32",
}
SPLIT_MEM_FRACTION = 0.4
"""mem_fraction_static of each engine when spec and shadow engines share the GPU."""
START_DEFAULTS: dict[str, Any] = {
    "log_level": "info",
    "disable_prefill_cuda_graph": True,
}
"""What makes a session start sooner. `log_level=info`: SGLang's start lines, which
`start.StartWatch` turns into phases, go to the session's log file. No prefill graphs (58 token
counts: 46 s cold, 5 s warm on the H200), and decode graphs only for the batch sizes the engine
will run (`decode_graph_sizes`; SGLang's default list is 23 to 36 sizes per graph set). The
graph settings apply only where no `--sglang-arg` names a CUDA-graph setting."""


@dataclass(frozen=True)
class SGLangOptions:
    """What `--engine sglang` needs beyond SessionSettings."""

    speculative_algorithm: str = "NEXTN"
    engine_args: dict[str, Any] = field(default_factory=dict)
    shadow_mode: Literal["split", "sequential"] = "split"
    force_patches: bool = False
    unpatch: tuple[str, ...] = ()
    """Patch flags (`gdn`, `attention`, `gemm`, `telemetry`, `dflash-logprobs`) left off in both
    engines, to see which fix matters on a model: the divergences come back (without
    `dflash-logprobs`, SGLang 0.5.17's DFLASH is refused: it returns no logprobs)."""
    log_file: Path | None = None
    """Where SGLang's processes write their output; None: `process.log_file_beside` the trace.
    Never the terminal: a TUI owns it, headless prints one line per error, and the start phases
    are read from the file."""


def parse_engine_arg(text: str) -> tuple[str, Any]:
    """`key=value` -> (key, value); the value as a Python literal when it is one, else str."""
    key, sep, raw = text.partition("=")
    key = key.strip().replace("-", "_")
    if not sep or not key.isidentifier():
        raise UsageError(
            f"{text!r}: expected KEY=VALUE, e.g. mem_fraction_static=0.4", setting="engine_args"
        )
    lowered = {"true": True, "false": False}  # `none` stays a string: grammar_backend=none
    if raw.strip().lower() in lowered:
        return key, lowered[raw.strip().lower()]
    try:
        return key, ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        return key, raw


def decode_graph_sizes(requests: int) -> list[int]:
    """The decode CUDA-graph batch sizes of an engine serving `requests` at once: powers of two
    below it and the number itself (a batch that shrinks as its requests finish replays the
    next size up, as SGLang pads)."""
    return sorted({1 << i for i in range(requests.bit_length()) if 1 << i < requests} | {requests})


def engine_kwargs(
    settings: SessionSettings,
    options: SGLangOptions,
    *,
    speculative: bool,
    split: bool,
    requests: int = 1,
) -> dict[str, Any]:
    """sglang.Engine keyword arguments of an engine serving `requests` at once: exactness and
    start defaults < session settings < --sglang-arg. Arguments that cannot serve `requests`
    concurrently are refused here, before anything starts."""
    if settings.model is None:
        raise UsageError(
            "the SGLang engine needs a checkpoint directory SGLang can load (HF format)",
            setting="model",
        )
    kw: dict[str, Any] = {
        **EXACT_DEFAULTS,
        "model_path": str(settings.model),
        "random_seed": settings.seed,
        "skip_tokenizer_init": False,
        # the prompts are text: a multimodal checkpoint (Qwen3.5's own class) would otherwise
        # load an image processor it never uses, and fail where the checkpoint has none
        "enable_multimodal": False,
    }
    if settings.dtype is not None:
        kw["dtype"] = settings.dtype
    if split:
        kw["mem_fraction_static"] = SPLIT_MEM_FRACTION
    if speculative:
        kw["speculative_algorithm"] = options.speculative_algorithm
        # every algorithm verifies k + 1 tokens, so -k means the same on each: DFLASH's block
        # is the anchor and k drafts (SGLang would otherwise take the draft config's
        # block_size, 16 for released drafts)
        if options.speculative_algorithm in algorithms.CHAIN:
            kw["speculative_num_steps"] = settings.k
            kw["speculative_eagle_topk"] = 1
            kw["speculative_num_draft_tokens"] = settings.k + 1
        else:
            # NGRAM, DFLASH: k + 1 verify tokens. NGRAM's breadth stays SGLang's (10): its
            # drafts are trees even at breadth 1 (several trie anchors), and SGLang gives GDN
            # verify the parent of each row only when breadth (its eagle topk) > 1. At breadth 1
            # the GDN state runs down the packed rows as if they were a chain (NGRAM k=5 on the
            # SGLang test pair: 2/24 prompts differ). The attention rows read each row's
            # ancestors from the mask.
            kw["speculative_num_draft_tokens"] = settings.k + 1
        if options.speculative_algorithm == "NEXTN":
            kw["speculative_draft_model_path"] = str(settings.draft or settings.model)
        elif settings.draft is not None:
            kw["speculative_draft_model_path"] = str(settings.draft)
    user = dict(options.engine_args)
    if not speculative:
        user = {k: v for k, v in user.items() if not k.startswith("speculative_")}
    graph_choice = any("cuda_graph" in key for key in user)
    start = dict(START_DEFAULTS)
    if not graph_choice:
        start["cuda_graph_bs_decode"] = decode_graph_sizes(requests)
    merged = {**start, **kw, **user}
    eager_rows = _patch_row() == "0.5.23" and "attention" not in options.unpatch
    if speculative and merged["attention_backend"] == "triton" and eager_rows and not graph_choice:
        # 0.5.23's Triton decode-row verify sizes its row index table from the batch (a host
        # sync), so it cannot be captured: decode/verify graphs off unless asked for.
        merged["disable_decode_cuda_graph"] = True
    refuse_concurrency(merged, requests)
    return merged


def refuse_concurrency(kwargs: dict[str, Any], requests: int) -> None:
    """A `UsageError` when an engine started with `kwargs` cannot run `requests` at once: a
    cap on running requests below it, or decode graphs that stop short of it (SGLang would run
    the larger batches eagerly, not the engine the flags describe)."""
    limit = kwargs.get("max_running_requests")
    if limit is not None and int(limit) < requests:
        raise UsageError(
            f"{requests} requests at once, but max_running_requests={limit}: lower the batch "
            f"or raise max_running_requests",
            setting="batch",
        )
    if kwargs.get("disable_cuda_graph") or kwargs.get("disable_decode_cuda_graph"):
        return
    sizes = kwargs.get("cuda_graph_bs_decode")
    largest = max(sizes) if sizes else kwargs.get("cuda_graph_max_bs_decode")
    if largest is not None and int(largest) < requests:
        raise UsageError(
            f"{requests} requests at once, but the decode CUDA graphs stop at batch size "
            f"{largest}: capture up to {requests} (cuda_graph_bs_decode) or leave the graph "
            "settings to specdash",
            setting="batch",
        )


def _patch_row() -> str | None:
    """The release row the scheduler applies (the installed one, or the one --force-patches
    chose); None where none applies: the engine is refused before it starts."""
    try:
        return patch_row()
    except RuntimeError:
        return None


def applied_patches(options: SGLangOptions) -> list[str]:
    """Names of the patches the scheduler processes apply: all but `--sglang-unpatch`."""
    from specdash.runs.sglang.patches import patch_set

    try:
        off = {patch_set.by_flag(flag).name for flag in options.unpatch}
    except KeyError as e:
        raise UsageError(str(e.args[0]), setting="unpatch") from None
    return [p.name for p in patch_set.all_patches() if p.name not in off]
