"""Help screen: the keys, and a glossary of every number the dashboard shows."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Markdown

GLOSSARY = """\
# specdash help

## Keys (also in the command palette, Ctrl+P)
| key | action |
|---|---|
| `g` | cycle the GEMM backend (the footer says *1 GEMM* where there is one to use) |
| `s` | speculation on / off |
| `+` / `-` | k (draft tokens per verify step) up / down |
| `v` | verify mode exact / fast |
| `space` | pause / resume the engine |
| `n` | skip to the next prompt |
| `e` | export the session so far to a JSONL trace and keep recording |
| `/` | type a prompt of your own (Enter queues it, Esc leaves the box) |
| `enter` | the detail of the divergence selected in the table (arrows move the selection) |
| `?` | this help |
| `q` | quit |

A control change applies at the engine's next step, never mid-step, and the engine reports
it as a `control` event.

## Glossary
Every number names its window: **1 s** = the last second of event time, **session** = since the
session started, **now** = the latest sample, **N ms** = the GPU sampler's window.

- **EXACT so far / DIVERGED at token n**: whether the speculative output has matched the shadow
  (plain greedy decode on the same weights) in token id *and* logprob bits at every position so
  far; the first divergence names its position and prompt.
- **t/s wall**: emitted tokens per second of the engine's elapsed time, everything included
  (prefill, drafting, verifying, the shadow run, rollback); the session's clock stops while
  the engine is paused or idle. While paused the "1 s" row says so instead of a rate.
- **spec t/s**: emitted tokens / (draft + verify + rollback seconds) of those steps: the speed of
  speculative decoding alone. Where the engine times whole requests (SGLang) the row **last
  req** is the latest finished request, prefill included, and the session row all of them.
- **shadow t/s**: the same tokens / seconds the shadow decode spent on them: the speed of plain
  greedy decoding.
- **speedup**: spec t/s / shadow t/s.
- **session s** (the charts' x axis): the session's clock, which stops while the engine is idle
  or paused, so a wait never stretches the axis and no line is drawn across it.
- **accepted drafts per verify step**: how many of the k drafted tokens the target kept (0..k).
- **kept: steps** (the histogram): verify steps by number of accepted drafts, one row per
  0..k (session). Rows that do not fit scroll (the wheel, or shift+tab then the arrows); the
  panel's bottom border says which are in view.
- **draft i: P(kept)**: P(draft i is accepted) among steps that drafted at least i tokens
  (session).
- **mean accepted length**: tokens emitted per verify step, the bonus token included.
- **acceptance rate**: accepted drafts / drafts actually proposed (the n-gram drafter often
  proposes fewer than k).
- **bonus token**: the token the target itself produces after the last accepted draft.
- **DRAM BW % (GPM)**: NVML GPM `DRAM_BW_UTIL`, share of the peak DRAM bandwidth used.
- **GB/s (derived)**: DRAM BW % x peak, peak = bus width x max memory clock x 2.
- **mem busy %**: NVML `utilization.memory`, the share of time memory was read or written; shown
  when GPM is unavailable; it saturates early and is *not* bandwidth.
- **SM util (GPM)**: share of SMs busy; power: board power draw; mem used: device memory in use.
- **requests**: one mark per prompt, in the order they started (a batch runs several at once):
  ✓ exact, ✗ diverged (from its first divergence on), • in flight, · not checked (no shadow).
- **divergence**: a position where the spec and shadow token ids differ (*token*) or only the
  fp32 logprob bits differ (*logprob*); **root cause**: the first layer and sub-op whose bits
  differ when the step is re-run in both paths; **gap** (the shadow's margin): its own top-1
  minus top-2 logprob at that position (= the logit gap), in nats and fp32 ulps. *tie*: within
  64 rounding steps of the model's dtype, so a flip there is rounding; *wide*: rounding cannot
  flip it, so a token flip means a kernel computed other values.

Press Esc to close.
"""


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,q,question_mark", "dismiss", "close")]
    AUTO_FOCUS = "#help"  # arrows, PgUp/PgDn and the wheel scroll the glossary at once

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help"):
            yield Markdown(GLOSSARY)
