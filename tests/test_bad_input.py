"""Bad input: one clear line on stderr, the documented exit code, never a traceback."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file
from tiny_models import build_tokenizer, write_pair

from specdash.cli import main
from specdash.errors import EXIT_CHECKPOINT, EXIT_ENVIRONMENT, EXIT_INTERRUPTED, EXIT_USAGE
from specdash.trace.jsonl import read_trace


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    return write_pair(tmp_path_factory.mktemp("tiny"))


def copy_target(pair: tuple[Path, Path, Path], tmp_path: Path) -> Path:
    dst = tmp_path / "model"
    shutil.copytree(pair[0], dst)
    return dst


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = main(["run", "--headless", "--max-new-tokens", "4", *args])
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err
    return code, err


def expect(capsys, code: int, fragment: str, *args: str) -> None:
    got, err = run_cli(capsys, *args)
    assert got == code, err
    assert len(err.splitlines()) == 1, err
    assert err.startswith("specdash: error: ")
    assert fragment in err, err


def test_missing_checkpoint(capsys, tmp_path) -> None:
    expect(
        capsys,
        EXIT_CHECKPOINT,
        "does not exist",
        "--model",
        str(tmp_path / "nope"),
        "--drafter",
        "ngram",
    )


def expect_model_error(capsys, pair, model: Path, fragment: str) -> None:
    expect(
        capsys,
        EXIT_CHECKPOINT,
        fragment,
        "--model",
        str(model),
        "--drafter",
        "ngram",
        "--prompts",
        str(pair[2]),
    )


def test_corrupt_safetensors(capsys, pair, tmp_path) -> None:
    model = copy_target(pair, tmp_path)
    data = (model / "model.safetensors").read_bytes()
    (model / "model.safetensors").write_bytes(data[: len(data) // 3])
    expect_model_error(capsys, pair, model, "corrupt safetensors")


def test_missing_tensor(capsys, pair, tmp_path) -> None:
    model = copy_target(pair, tmp_path)
    tensors = load_file(model / "model.safetensors")
    del tensors["model.layers.3.self_attn.o_proj.weight"]
    save_file(tensors, model / "model.safetensors")
    expect_model_error(capsys, pair, model, "missing tensor model.layers.3.self_attn.o_proj.weight")


@pytest.mark.parametrize(
    "change,fragment",
    [
        ({"intermediate_size": 96}, "mlp.gate_proj.weight has shape"),
        ({"architectures": ["LlamaForCausalLM"]}, "unsupported architecture"),
        ({"architectures": []}, "unsupported architecture"),
        (
            {"architectures": ["Qwen3NextForCausalLM"], "num_experts": 8, "mlp_only_layers": []},
            "mixture-of-experts",
        ),
        ({"use_sliding_window": True}, "sliding-window"),
        ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e6}}, "rope type 'yarn'"),
    ],
)
def test_config_the_engine_cannot_run(capsys, pair, tmp_path, change, fragment) -> None:
    model = copy_target(pair, tmp_path)
    cfg = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps(cfg | change))
    expect_model_error(capsys, pair, model, fragment)


def test_config_not_json(capsys, pair, tmp_path) -> None:
    model = copy_target(pair, tmp_path)
    (model / "config.json").write_text("{not json")
    expect_model_error(capsys, pair, model, "not valid JSON")


def test_draft_tokenizer_differs(capsys, pair, tmp_path) -> None:
    draft = tmp_path / "draft"
    shutil.copytree(pair[1], draft)
    build_tokenizer(vocab_size=300).save(str(draft / "tokenizer.json"))
    expect(
        capsys,
        EXIT_CHECKPOINT,
        "draft tokenizer differs",
        "--model",
        str(pair[0]),
        "--draft",
        str(draft),
        "--prompts",
        str(pair[2]),
    )


def test_prompt_longer_than_context(capsys, pair, tmp_path) -> None:
    prompts = tmp_path / "long.jsonl"
    prompts.write_text(json.dumps({"prompt": "".join(chr(97 + i % 26) for i in range(9000))}))
    expect(
        capsys,
        EXIT_USAGE,
        f"the target model ({pair[0]}) has 4096",
        "--model",
        str(pair[0]),
        "--drafter",
        "ngram",
        "--prompts",
        str(prompts),
    )


def expect_flag_error(capsys, line: str, *args: str, command: str = "run") -> None:
    """A flag error: its line, then the hint every flag error has, exit 2 (argparse's own
    errors exit through SystemExit, the ones it cannot see alone return the code)."""
    try:
        code = main([command, *(["--headless"] if command == "run" else []), *args])
    except SystemExit as e:
        code = e.code
    err = capsys.readouterr().err
    assert code == EXIT_USAGE, err
    assert err == f"specdash: error: {line}\nhint: `specdash {command} --help` lists every flag\n"


@pytest.mark.parametrize(
    ("flag", "value", "bounds"),
    [
        ("-k", "0", "1..16"),
        ("-k", "17", "1..16"),
        ("-k", "-3", "1..16"),
        ("--batch", "0", "1 or more"),
        ("--max-new-tokens", "0", "1 or more"),
    ],
)
def test_a_value_out_of_range_is_a_flag_error(capsys, pair, flag, value, bounds) -> None:
    line = f"argument {flag}: {value} is out of range ({bounds})"
    expect_flag_error(capsys, line, "--model", str(pair[0]), "--drafter", "ngram", flag, value)


def test_audit_ks_out_of_range_is_a_flag_error(capsys) -> None:
    line = "argument --ks: 0 is out of range (1..16)"
    expect_flag_error(capsys, line, "--ks", "1,0", command="audit")


def test_replay_speed_zero_is_a_flag_error(capsys, tmp_path) -> None:
    line = "argument --speed: 0 is out of range (above 0)"
    expect_flag_error(capsys, line, str(tmp_path / "t.jsonl"), "--speed", "0", command="replay")


def test_a_draft_with_the_ngram_drafter_is_refused(capsys, pair) -> None:
    line = (
        f"--draft: {pair[1]} is not used with --drafter ngram (it drafts from the prompt); "
        "leave out --draft, or draft with it: --drafter model"
    )
    expect_flag_error(
        capsys, line, "--model", str(pair[0]), "--draft", str(pair[1]), "--drafter", "ngram"
    )


def test_a_draft_whose_config_disagrees_with_its_weights_is_named(capsys, pair, tmp_path) -> None:
    draft = tmp_path / "draft"
    shutil.copytree(pair[1], draft)
    cfg = json.loads((draft / "config.json").read_text())
    (draft / "config.json").write_text(json.dumps(cfg | {"intermediate_size": 96}))
    args = ["--model", str(pair[0]), "--draft", str(draft), "--prompts", str(pair[2])]
    fragment = (
        f"{draft / 'model.safetensors'}: model.layers.0.mlp.gate_proj.weight has shape "
        f"(128, 64), {draft / 'config.json'} implies (96, 64)"
    )
    expect(capsys, EXIT_CHECKPOINT, fragment, *args)


@pytest.mark.parametrize(
    "content,fragment",
    [
        (None, "does not exist"),
        ("{oops\n", "not JSON"),
        ('{"text": "x"}\n', '"prompt" string'),
        ("\n\n", "no prompts"),
        (b"\xff\xfe\x00", "cannot read"),
    ],
)
def test_unreadable_prompt_file(capsys, pair, tmp_path, content, fragment) -> None:
    path = tmp_path / "prompts.jsonl"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    expect(
        capsys,
        EXIT_USAGE,
        fragment,
        "--model",
        str(pair[0]),
        "--drafter",
        "ngram",
        "--prompts",
        str(path),
    )


def test_unwritable_trace_path(capsys, pair, tmp_path) -> None:
    expect(
        capsys,
        EXIT_ENVIRONMENT,
        "cannot write trace",
        "--model",
        str(pair[0]),
        "--drafter",
        "ngram",
        "--prompts",
        str(pair[2]),
        "--trace",
        str(tmp_path / "no" / "such" / "dir" / "t.jsonl"),
    )


def test_cuda_requested_without_gpu(capsys, pair) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    expect(
        capsys,
        EXIT_ENVIRONMENT,
        "no CUDA device",
        "--model",
        str(pair[0]),
        "--drafter",
        "ngram",
        "--device",
        "cuda",
    )


def test_unknown_gemm_backend(capsys, pair) -> None:
    expect(
        capsys,
        EXIT_ENVIRONMENT,
        "GEMM backend 'deepgemm'",
        "--model",
        str(pair[0]),
        "--drafter",
        "ngram",
        "--gemm-backend",
        "deepgemm",
    )


def test_ctrl_c_mid_step_exits_130_and_keeps_the_trace(pair, tmp_path) -> None:
    trace = tmp_path / "t.jsonl"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "specdash.cli",
            "run",
            "--headless",
            "--model",
            str(pair[0]),
            "--draft",
            str(pair[1]),
            "--prompts",
            str(pair[2]),
            "--max-new-tokens",
            "3000",
            "--trace",
            str(trace),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=os.environ | {"PYTHONUNBUFFERED": "1"},
        # Ctrl-C's default action, even when the test run is a background job (a shell starts
        # those with SIGINT ignored, and the child would inherit that and never see it)
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.time() + 60
    while time.time() < deadline:
        if trace.exists() and '"verify_step"' in trace.read_text():
            break
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == EXIT_INTERRUPTED, err
    assert "Traceback" not in err
    header, events, _warnings = read_trace(trace)
    assert any(e.kind == "verify_step" for e in events)


def test_prompt_that_fills_the_context_exactly_runs(capsys, pair, tmp_path) -> None:
    """prompt + new - 1 positions are fed (the last generated token never is): a prompt
    that needs exactly the model's positions runs, one token more is refused."""
    from specdash.engine.loader import load_models
    from specdash.settings import SessionSettings

    loaded = load_models(SessionSettings(model=pair[0], drafter="ngram"))
    tok, limit = loaded.tokenizer, loaded.target.cfg.max_position_embeddings
    text = tok.decode(tok.encode(" ".join(f"w{i % 97}" for i in range(4000)))[: limit - 40])
    n = len(tok.encode(text))
    prompts = tmp_path / "fits.jsonl"
    prompts.write_text(json.dumps({"prompt": text}) + "\n")
    args = ["--model", str(pair[0]), "--drafter", "ngram", "--prompts", str(prompts), "--json"]
    new = limit - n + 1
    assert main(["run", "--headless", "--max-new-tokens", str(new), *args]) == 0
    assert json.loads(capsys.readouterr().out)["new_tokens"] == new  # the last position used
    code = main(["run", "--headless", "--max-new-tokens", str(new + 1), *args])
    err = capsys.readouterr().err.strip()
    assert code == EXIT_USAGE
    assert f"it needs {limit + 1} positions, the target model ({pair[0]}) has {limit}" in err


def test_prompt_with_a_lone_surrogate(capsys, pair, tmp_path) -> None:
    """JSON can spell a lone surrogate (\\ud800): no Unicode text, and no tokenizer takes it."""
    prompts = tmp_path / "surrogate.jsonl"
    prompts.write_text('{"prompt": "fine"}\n{"prompt": "abc \\ud800 def"}\n')
    args = ["--model", str(pair[0]), "--drafter", "ngram", "--prompts", str(prompts)]
    expect(capsys, EXIT_USAGE, f"{prompts}:2: prompt holds a lone surrogate", *args)


def test_short_draft_is_refused_at_load(capsys, pair, tmp_path) -> None:
    """The draft is fed the prompt, then every position but the last two: a draft with fewer
    positions than that is refused before any prompt decodes, naming the draft (the target has
    room); one with exactly that many decodes every token, its last position included. The
    draft is the target's weights, so (nearly) every draft is accepted and the steps end in
    one that drafts the most tokens the room allows."""
    from specdash.engine.loader import load_models
    from specdash.settings import SessionSettings

    tok = load_models(SessionSettings(model=pair[0], drafter="ngram")).tokenizer
    text = " ".join(f"w{i % 97}" for i in range(60))
    while len(tok.encode(text)) % 8 != 5:  # full acceptance then ends with a room of 4
        text += " x"
    n, positions = len(tok.encode(text)), 256
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": text}) + "\n")
    draft = tmp_path / "draft"
    shutil.copytree(pair[0], draft)
    cfg = json.loads((draft / "config.json").read_text())
    (draft / "config.json").write_text(json.dumps(cfg | {"max_position_embeddings": positions}))
    new = positions - n + 2
    args = ["--model", str(pair[0]), "--draft", str(draft), "--prompts", str(prompts), "-k", "7"]
    trace = tmp_path / "t.jsonl"
    code = main(["run", "--headless", "--max-new-tokens", str(new), *args, "--trace", str(trace)])
    assert code == 0, capsys.readouterr().err
    _, events, _ = read_trace(trace)
    steps = [e for e in events if e.kind == "verify_step"]
    assert sum(len(e.emitted_tokens) for e in steps) == new - 1
    # the draft feeds the last emitted token and all its proposals but the last
    before = list(itertools.accumulate([1] + [len(e.emitted_tokens) for e in steps]))
    fed = [n + b - 1 + len(e.draft_tokens) - 1 for b, e in zip(before, steps, strict=False)]
    assert max(fed) == positions - 1
    capsys.readouterr()
    expect(
        capsys,
        EXIT_USAGE,
        f"it needs {positions + 1} positions, the draft model ({draft}) has {positions}",
        *args,
        "--max-new-tokens",
        str(new + 1),
    )
