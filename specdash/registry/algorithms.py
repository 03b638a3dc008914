"""SGLang's speculative algorithms: `--speculative-algorithm`'s choices. SGLang implements
them; specdash passes the name, shapes -k for each (`chain`) and says before a start why one
cannot run (`specdash.runs.sglang.algorithms`)."""

from __future__ import annotations

from dataclasses import dataclass

from specdash.registry import Entry, names


@dataclass(frozen=True, slots=True)
class AlgorithmEntry(Entry):
    chain: bool = True
    """It drafts a chain of k tokens one step at a time (steps=k, topk=1); else k drafts in
    one block (DFLASH) or tree (NGRAM). Every algorithm verifies k + 1 tokens."""


ALGORITHMS: tuple[AlgorithmEntry, ...] = (
    AlgorithmEntry("NEXTN", "the target checkpoint's MTP head drafts", None),
    AlgorithmEntry("EAGLE3", "an EAGLE3 draft head on the target's hidden states", None),
    AlgorithmEntry("DFLASH", "a DFlash draft of this target, k drafts per block", None, False),
    AlgorithmEntry("STANDALONE", "a small draft model drafts", None),
    AlgorithmEntry("NGRAM", "prompt lookup (n-gram), drafts as trees", None, False),
)

NAMES = names(ALGORITHMS)
CHAIN = names(a for a in ALGORITHMS if a.chain)
