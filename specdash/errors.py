"""User-facing errors: one line of text and a documented exit code, never a traceback.

Exit codes (also in the README):
  0  success
  1  a divergence was found (`run --fail-on-divergence`, `audit` exact-mode failure, `diff`;
     `compare`: a run not deterministic: spec != shadow, or re-scoring off its recorded bits)
  2  bad usage or bad input (flags, prompt file, a lone surrogate in a prompt, k out of
     range, a prompt too long for the target's or the draft's positions, an output that is an
     input or not a regular file, an existing output without --overwrite, a trace another
     specdash is writing or no session could have written, an SGLang batch above what its
     engine arguments let it run at once)
  3  checkpoint problem (missing/unreadable/corrupt files, a config value of the wrong type
     or out of range, missing tensor, shape mismatch, unsupported architecture or
     activation, tokenizer mismatch, a draft vocabulary larger than the target's)
  4  environment problem (no GPU/NVML/SGLang where required, unsupported SGLang version,
     an SGLang scheduler process died, the dashboard's engine process died,
     unwritable output path, a stdout that cannot take the output, an I/O error while
     recording a trace)
  5  `diff`: a recording ends mid-prompt and the tokens both traces hold are identical;
     `compare`: determinism not known (no shadow, no summary, a recording cut mid-prompt)
  130 interrupted (Ctrl-C); partial results and the trace are kept
  143, 129  terminated by SIGTERM, SIGHUP (`specdash.cli.signals`), handled as Ctrl-C is

The core speaks of settings, not flags: an error about one names it in `setting` (a field of
`SessionSettings` or `SGLangOptions`), and the command line puts its flag in front
(`specdash.cli.flags.describe`).
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_DIVERGED = 1
EXIT_USAGE = 2
EXIT_CHECKPOINT = 3
EXIT_ENVIRONMENT = 4
EXIT_INCOMPLETE = 5
EXIT_INTERRUPTED = 130


class SpecdashError(Exception):
    exit_code = EXIT_USAGE

    def __init__(self, message: str = "", *, setting: str | None = None) -> None:
        super().__init__(message)
        self.setting = setting
        """The setting the error is about, if one is: the CLI names its flag."""


class UsageError(SpecdashError):
    exit_code = EXIT_USAGE


class FlagError(UsageError):
    """A flag's value, or two flags together, that argparse cannot judge alone: reported like
    argparse's own flag errors, with the hint to `--help` on a second line."""


class CheckpointError(SpecdashError):
    exit_code = EXIT_CHECKPOINT


class EnvironmentProblem(SpecdashError):
    exit_code = EXIT_ENVIRONMENT
