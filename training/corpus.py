"""The offline training corpus: the running interpreter's standard library sources.

Every machine with Python has it, so the tiny checkpoints can be rebuilt without a
download. The file list is sorted, tests and site-packages are left out, and a fixed
hash of each path picks the held-out files, so the split does not move when the
interpreter gains or loses a file.
"""

from __future__ import annotations

import hashlib
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

EOS = "<|endoftext|>"
_EXCLUDED_DIRS = {"test", "tests", "idle_test", "site-packages", "__pycache__"}
HELDOUT_EVERY = 16
"""About one file in HELDOUT_EVERY (by path hash) is held out for prompts and evaluation."""


@dataclass(frozen=True, slots=True)
class SourceFile:
    path: str  # relative to the stdlib root, '/'-separated
    text: str
    sha256: str


@dataclass(frozen=True, slots=True)
class Corpus:
    root: Path
    train: list[SourceFile]
    heldout: list[SourceFile]
    skipped: list[str]  # not valid UTF-8

    def manifest(self) -> dict:
        """File list and hashes: enough to tell whether another machine saw the same text."""
        files = self.train + self.heldout
        concat = hashlib.sha256()
        for f in sorted(files, key=lambda f: f.path):
            concat.update(f.text.encode())
        return {
            "source": "Python standard library of the training interpreter",
            "python": sys.version.split()[0],
            "stdlib_root": str(self.root),
            "heldout_rule": f"sha256(path)[0:8] as int % {HELDOUT_EVERY} == 0",
            "sha256_of_concatenation": concat.hexdigest(),
            "concatenation_order": "all files sorted by path, UTF-8 bytes back to back",
            "num_train_files": len(self.train),
            "num_heldout_files": len(self.heldout),
            "train_chars": sum(len(f.text) for f in self.train),
            "heldout_chars": sum(len(f.text) for f in self.heldout),
            "skipped_not_utf8": self.skipped,
            "files": [
                {"path": f.path, "sha256": f.sha256, "split": split}
                for split, group in (("train", self.train), ("heldout", self.heldout))
                for f in group
            ],
        }


def is_heldout(rel_path: str) -> bool:
    digest = hashlib.sha256(rel_path.encode()).hexdigest()
    return int(digest[:8], 16) % HELDOUT_EVERY == 0


def collect_corpus(root: Path | None = None, max_files: int | None = None) -> Corpus:
    """Read `root` (default: this interpreter's stdlib) in sorted path order.

    `max_files` keeps every n-th file so a CI run still sees both splits.
    """
    root = Path(root or sysconfig.get_paths()["stdlib"])
    paths = sorted(
        p
        for p in root.rglob("*.py")
        if not _EXCLUDED_DIRS.intersection(p.relative_to(root).parts[:-1])
    )
    if max_files is not None and len(paths) > max_files:
        stride = len(paths) / max_files
        paths = [paths[int(i * stride)] for i in range(max_files)]
    train, heldout, skipped = [], [], []
    for p in paths:
        rel = p.relative_to(root).as_posix()
        raw = p.read_bytes()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            skipped.append(rel)
            continue
        f = SourceFile(rel, text, hashlib.sha256(raw).hexdigest())
        (heldout if is_heldout(rel) else train).append(f)
    return Corpus(root, train, heldout, skipped)


def train_tokenizer(texts: list[str], vocab_size: int) -> Tokenizer:
    """Byte-level BPE (GPT-2 style, no prefix space) so any text round-trips exactly."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok
