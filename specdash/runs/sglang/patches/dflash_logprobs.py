"""DFLASH returns the logprobs of the tokens it commits, as SGLang 0.5.23's does (0.5.17 only).

Why: specdash compares every emitted token's fp32 logprob with the shadow run's, so each of its
requests asks for logprobs, and SGLang 0.5.17's DFLASH refuses them twice: the scheduler aborts
the request (`dflash_utils.validate_dflash_request`, imported by name into `managers.scheduler`)
and `DFlashWorkerV2.forward_batch_generation` raises on a batch that returns logprobs. 0.5.23
takes such requests and, after the verify's accept, calls
`compute_spec_logprobs(batch, logits_output, out_tokens.reshape(-1), chain_stride=block_size)`.

The patch (0.5.17), the smallest port of that:
- `validate_dflash_request` becomes 0.5.23's (only its return_hidden_states refusal is left),
  in `dflash_utils` and in the scheduler module that imported it by name;
- `forward_batch_generation` is the installed method's own source with two edits, each of a
  text that must occur in it exactly once (`LOGPROB_EDITS`): the raise is gone, and after the
  accept (and SGLang's simulated acceptance), before the mamba state commit, where 0.5.23 puts
  it, `chain_logprobs` fills the logprob fields. Every other line runs as shipped; the source
  is compiled in a copy of its module's globals. The same edits ship as
  `diffs/0.5.17/dflash_logprobs.diff`.
- The prefill needs nothing: DFLASH's target prefill is the target worker's ordinary
  `forward_batch_generation(batch)`, whose sampler returns the first token's logprob (and any
  input logprobs) exactly as a plain engine's prefill does; only the raise stood in its way.

0.5.23 needs nothing; its variant records what it relies on.
"""

from __future__ import annotations

from typing import Any

from specdash.runs.sglang.patches.registry import (
    Patch,
    Rebinding,
    Target,
    Variant,
    compiled_from_edited,
    edited_source,
)

_UTILS = "sglang.srt.speculative.dflash_utils"
_SCHEDULER = "sglang.srt.managers.scheduler"
_WORKER = "sglang.srt.speculative.dflash_worker_v2.DFlashWorkerV2"
_LOGPROBS = "sglang.srt.layers.logprob_processor"
_RESULTS = (
    "sglang.srt.managers.scheduler_components.batch_result_processor."
    "SchedulerBatchResultProcessor._apply_decode_logprobs"
)

LOGPROB_EDITS: tuple[tuple[str, str], ...] = (
    # (text in 0.5.17's `DFlashWorkerV2.forward_batch_generation`, its replacement); each
    # occurs once. 1: the refusal at the top goes.
    (
        """\
        if getattr(batch, "return_logprob", False):
            raise ValueError(
                "DFLASH speculative decoding does not support return_logprob yet."
            )
        self._validate_phase1_sampling_support(batch)
""",
        """\
        self._validate_phase1_sampling_support(batch)
""",
    ),
    # 2: the committed tokens' logprobs, from the verify logits, before the mamba commit.
    (
        """\
        if self._need_mamba_verify_commit:
            assert seq_lens_pre_verify is not None
""",
        """\
        if batch.return_logprob:
            # specdash dflash_logprobs: the committed tokens' logprobs, where 0.5.23 takes them.
            from specdash.runs.sglang.patches.dflash_logprobs import chain_logprobs

            chain_logprobs(batch, logits_output, out_tokens, block_size)

        if self._need_mamba_verify_commit:
            assert seq_lens_pre_verify is not None
""",
    ),
)


def chain_logprobs(batch: Any, logits_output: Any, out_tokens: Any, block_size: int) -> None:
    """Fill `logits_output.next_token_logprobs` ([bs, block]) and, where asked, the top-k and
    token-id logprobs (bs * block rows) for DFLASH's verify: row b * block + j of the verify
    logits predicts `out_tokens[b, j]` (a chain, the layout 0.5.23's `chain_stride` names); the
    scheduler keeps each request's first accept-length entries.

    It is 0.5.17's own spec-v2 logprob step, `compute_spec_v2_logprobs` (what its EAGLE and
    NGRAM workers call), given the identity accept index, so the rows it gathers are the
    verify logits unchanged. Why that gives plain decode's bits: plain greedy decode
    (`Sampler.forward`, all-greedy branch) takes `torch.nn.functional.log_softmax(logits,
    dim=-1)` of the fp32 `next_token_logits`, clamps it at the dtype's min and picks
    `[arange, next_ids]` (`OutputLogprobProcessor.compute_logprobs`);
    `compute_spec_v2_logprobs` runs the same op on the same dtype (the fp32 verify logits),
    the same clamp and the same pick. log_softmax reduces each row on its own (deterministic
    inference's batch-invariant `_log_softmax`: one program per row), so a verify row whose
    logits equal decode's gives decode's logprob bits. `log(softmax(x))` or bf16 logits would
    not.
    """
    import torch
    from sglang.srt.layers.logprob_processor import compute_spec_v2_logprobs

    bs = out_tokens.shape[0]
    rows = torch.arange(bs * block_size, device=out_tokens.device).view(bs, block_size)
    compute_spec_v2_logprobs(batch, logits_output, out_tokens.reshape(-1), rows, block_size - 1)


def with_logprobs(source: str) -> str:
    """0.5.17's `forward_batch_generation` source (the method or its module) with
    `LOGPROB_EDITS` applied; ValueError when a replaced text is not there exactly once."""
    return edited_source(source, LOGPROB_EDITS, "dflash_logprobs: worker text")


def _forward_with_logprobs(original: Any) -> Any:
    """The method compiled from its edited source in a copy of its module's globals."""
    method = compiled_from_edited(original, LOGPROB_EDITS, "dflash_logprobs")
    method.__qualname__ = original.__qualname__
    method.__specdash_original__ = original
    return method


def validate_dflash_request(req: Any, enable_overlap: bool) -> str | None:
    """0.5.23's `validate_dflash_request`: DFLASH takes requests that return logprobs."""
    if enable_overlap and req.return_hidden_states:
        return "DFLASH speculative decoding does not support return_hidden_states yet."
    return None


PATCH = Patch(
    name="dflash_logprobs",
    flag="dflash-logprobs",
    summary="DFLASH returns the committed tokens' logprobs (0.5.23's, ported to 0.5.17)",
    variants={
        "0.5.17": Variant(
            targets=(
                Target(
                    f"{_UTILS}.validate_dflash_request",
                    "262ff1bbfa050d3010ee6ecdc3aaa3e739f2a48061ec7f3ab089e13d4924b1c3",
                ),
                Target(
                    f"{_WORKER}.forward_batch_generation",
                    "82e499324fd0215f4ae1598665030eabfa941d8c3d8fa3d38e352104abaa3a9e",
                ),
                Target(  # calls validate_dflash_request by the name the patch rebinds
                    f"{_SCHEDULER}.Scheduler.handle_generate_request",
                    "92c868013f09ce8ec78fca90e4c278d3b6b5f77578d77cb08f0bd880292740be",
                    role="relied on",
                ),
                Target(
                    f"{_LOGPROBS}.compute_spec_v2_logprobs",
                    "90066e0e0fc09ef26d0b3a604585c2ef8b313caa6e593c8f10dc07cf2c37e25a",
                    role="relied on",
                ),
                Target(  # reads request i's logprobs as row i, top-k as i * block + j
                    _RESULTS,
                    "efee15068623ca760ad523f3927ddb619b2b25e65acf07cb433987e6773ea642",
                    role="relied on",
                ),
            ),
            rebindings=(
                Rebinding(_UTILS, "validate_dflash_request", lambda _: validate_dflash_request),
                Rebinding(_SCHEDULER, "validate_dflash_request", lambda _: validate_dflash_request),
                Rebinding(_WORKER, "forward_batch_generation", _forward_with_logprobs),
            ),
        ),
        "0.5.23": Variant(
            targets=(
                Target(
                    f"{_UTILS}.validate_dflash_request",
                    "249cb3f605b661110c8fb65ba5435804b0179eb61192b7f9d871c373b7080d68",
                    role="relied on",
                ),
                Target(
                    f"{_WORKER}.forward_batch_generation",
                    "54e805c8c67241cffca1ff1dae5f09931ec8420861051a4f6fa984c60c20b7ac",
                    role="relied on",
                ),
                Target(
                    f"{_LOGPROBS}.compute_spec_logprobs",
                    "342e0ba0fc45731d19beb18ad14952335b9605b3c7f2ebb5633ddb15914de6c7",
                    role="relied on",
                ),
            ),
            rebindings=(),
        ),
    },
)
