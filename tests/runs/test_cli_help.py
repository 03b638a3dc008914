"""`--help` of every command: a help line for every flag, defaults and choices shown, and the
top-level help says first what plain `specdash` does. A usage error is one line + a hint."""

from __future__ import annotations

import argparse

import pytest
import torch
from pydantic import ValidationError

from specdash.cli import build_parser, main
from specdash.errors import EXIT_USAGE
from specdash.kernels import gemm_backends
from specdash.registry import algorithms, drafters, engines, gemm
from specdash.settings import SessionSettings


def parsers() -> dict[str, argparse.ArgumentParser]:
    top = build_parser()
    found = {"specdash": top}
    todo = [top]
    while todo:
        for action in todo.pop()._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    found[sub.prog] = sub
                    todo.append(sub)
    return found


def test_every_flag_and_argument_has_a_help_line() -> None:
    missing = [
        f"{prog} {'/'.join(a.option_strings) or a.dest}"
        for prog, p in parsers().items()
        for a in p._actions
        if not a.help and not isinstance(a, argparse._SubParsersAction)
    ]
    assert missing == []


def test_help_shows_defaults_and_choices(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    text = " ".join(capsys.readouterr().out.split())  # unwrapped
    for expected in (
        "--gemm-backend {auto,torch,cublas,triton,triton-fused,triton-fp8,deepgemm}",
        "GEMM implementation; auto: torch on the CPU, triton on CUDA (triton-fp8 for a block-FP8 "
        "model); torch: ",
        "--verify {exact,fast}",
        "(default: exact)",
        "--max-new-tokens N tokens generated per prompt (default: 64)",
        "--drafter {model,ngram}",
        "--device DEVICE cpu, cuda or cuda:N (default: cpu)",
        "-k K draft tokens per verify step, 1..16 (default: 4)",
        "--json print one JSON summary object",
    ):
        assert expected in text
    assert "(default: None)" not in text and "(default: False)" not in text
    with pytest.raises(SystemExit):
        main(["audit", "--help"])
    assert "--json print the cells as one JSON object" in " ".join(capsys.readouterr().out.split())


def test_top_level_help_starts_with_the_dashboard(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert out.startswith("usage: specdash [session flags]       (the dashboard)\n")
    description = out.split("\n\n")[1]
    assert description.startswith("Plain `specdash` opens the dashboard")


@pytest.mark.parametrize(
    ("argv", "message", "hint"),
    [
        (
            ["run", "-k", "x"],
            "argument -k: expected a whole number, got 'x'",
            "specdash run --help",
        ),
        (["run", "--bogus"], "unrecognized arguments: --bogus", "specdash --help"),
        (["frobnicate"], "argument COMMAND: invalid choice: 'frobnicate'", "specdash --help"),
        (["run", "--gemm-backend", "cutlass"], "invalid choice: 'cutlass'", "specdash run --help"),
        (["patches"], "required: SUBCOMMAND", "specdash patches --help"),
    ],
)
def test_usage_error_is_one_line_and_a_hint(capsys, argv, message, hint) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == EXIT_USAGE
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2, err
    assert err[0].startswith("specdash: error: ") and message in err[0]
    assert err[1] == f"hint: `{hint}` lists every flag"


def test_gemm_backend_choices_are_the_engines_names() -> None:
    names = set(gemm_backends.backends(torch.device("cpu"))) | set(gemm_backends.gpu_backends())
    assert set(gemm.NAMES) == names | {"auto"}


def test_every_choice_and_its_help_comes_from_its_registry() -> None:
    """One list per concept: the flags' choices are the registries' names, each with its line
    of help, and the settings take exactly those names."""
    run = parsers()["specdash run"]
    actions = {a.option_strings[0]: a for a in run._actions if a.option_strings}
    tables = {"--engine": engines.ENGINES, "--drafter": drafters.DRAFTERS,
              "--speculative-algorithm": algorithms.ALGORITHMS,
              "--gemm-backend": gemm.GEMM_BACKENDS}  # fmt: skip
    for flag, entries in tables.items():
        action = actions[flag]
        assert tuple(action.choices or ()) == tuple(e.name for e in entries), flag
        assert all(f"{e.name}: {e.help}" in (action.help or "") for e in entries), flag
    for name in drafters.NAMES:
        assert SessionSettings(drafter=name).drafter == name
        assert drafters.algorithm(name) in algorithms.NAMES  # the header names it
    for entry in (*drafters.DRAFTERS, *engines.ENGINES, *gemm.GEMM_BACKENDS):
        assert entry.implementation is None or callable(entry.load())
    with pytest.raises(ValidationError, match="'vllm' is not one of native, sglang"):
        SessionSettings(engine="vllm")


def test_batch_help_says_what_batch_does() -> None:
    """--batch decodes the prompts in flight in one forward a step, with the same bits."""
    line = " ".join(
        build_parser()._subparsers._group_actions[0].choices["run"].format_help().split()
    )
    assert "--batch N N prompts decoded together, one forward a step (exact mode: the same" in line
