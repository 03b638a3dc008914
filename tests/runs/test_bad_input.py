"""Bad input: one clear line on stderr, the documented exit code, never a traceback."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file
from tiny_models import build_tokenizer

from specdash.cli import main
from specdash.errors import EXIT_CHECKPOINT, EXIT_ENVIRONMENT, EXIT_INTERRUPTED, EXIT_USAGE
from specdash.prompts import load_prompts
from specdash.runs.native import NativeBackend
from specdash.settings import SessionSettings
from specdash.trace.jsonl import read_trace


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
    code: object
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


@pytest.mark.parametrize("speed", ["0", "inf", "nan"])
def test_a_replay_speed_not_finite_above_zero_is_a_flag_error(capsys, tmp_path, speed) -> None:
    line = f"argument --speed: {speed} is out of range (a finite number above 0)"
    expect_flag_error(capsys, line, str(tmp_path / "t.jsonl"), "--speed", speed, command="replay")


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (
            ["--overwrite"],
            "argument --overwrite/--overwrite-trace: only with --trace (it replaces an existing "
            "trace; without --trace nothing is recorded)",
        ),
        (
            ["--sglang-arg", "mem_fraction_static=0.4"],
            "argument --sglang-arg: only with --engine sglang (the native engine does not read it)",
        ),
        (
            ["--speculative-algorithm", "EAGLE3"],
            "argument --speculative-algorithm: only with --engine sglang (the native engine does "
            "not read it)",
        ),
        (
            ["--sglang-shadow", "sequential"],
            "argument --sglang-shadow: only with --engine sglang (the native engine does not "
            "read it)",
        ),
        (
            ["--preset", "tiny-hybrid", "--model", "/nonexistent", "--drafter", "ngram"],
            "argument --model: give --model or --preset, not both (a preset is the target)",
        ),
        (
            ["--force-patches"],
            "argument --force-patches: only with --engine sglang (the native engine does not "
            "read it)",
        ),
    ],
    ids=[
        "overwrite",
        "sglang-arg",
        "speculative-algorithm",
        "sglang-shadow",
        "preset-model",
        "force-patches",
    ],  # fmt: skip
)
@pytest.mark.parametrize("command", ["run", "audit"])
def test_a_flag_the_session_would_ignore_is_refused(capsys, pair, command, args, line) -> None:
    expect_flag_error(capsys, line, "--prompts", str(pair[2]), *args, command=command)


def test_a_cpu_device_index_is_refused(capsys, pair) -> None:
    """torch takes `cpu:1` and runs on the one CPU: the index would be silently ignored."""
    expect(
        capsys,
        EXIT_USAGE,
        "--device: 'cpu:1': there is one CPU device (cpu); an index is for cuda:N",
        "--model", str(pair[0]), "--drafter", "ngram", "--prompts", str(pair[2]),
        "--device", "cpu:1",
    )  # fmt: skip


def test_a_cuda_index_past_the_visible_gpus_is_refused(capsys, pair, monkeypatch) -> None:
    """torch would fail deep inside the first allocation: `cuda:2` on a machine with two GPUs
    is refused up front, naming the devices there are."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    expect(
        capsys,
        EXIT_ENVIRONMENT,
        "--device: 'cuda:2': torch sees 2 CUDA devices (cuda:0, cuda:1)",
        "--model", str(pair[0]), "--drafter", "ngram", "--prompts", str(pair[2]),
        "--device", "cuda:2",
    )  # fmt: skip


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
        # valid JSON that Python's json cannot read
        ('{"prompt": "x", "m": ' + "[" * 10**5 + "]" * 10**5 + "}\n", ":1: not JSON (nested too"),
        ('{"prompt": "x", "n": ' + "9" * 5000 + "}\n", ":1: not JSON (Exceeds the limit (4300"),
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


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_and_sighup_end_a_run_as_ctrl_c_does(pair, tmp_path, signum) -> None:
    """The trace closed and readable, one line, the shell's code for the signal."""
    trace = tmp_path / "t.jsonl"
    args = ["--model", str(pair[0]), "--draft", str(pair[1]), "--prompts", str(pair[2])]
    proc = subprocess.Popen(
        [sys.executable, "-m", "specdash.cli", "run", "--headless", *args,
         "--max-new-tokens", "3000", "--trace", str(trace)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signum, signal.SIG_DFL),
    )  # fmt: skip
    deadline = time.time() + 60
    while time.time() < deadline and not (trace.exists() and '"verify_step"' in trace.read_text()):
        time.sleep(0.1)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signum, err
    assert err.strip().splitlines() == [f"specdash: terminated ({signal.Signals(signum).name})"]
    _, events, warnings = read_trace(trace)
    assert any(e.kind == "verify_step" for e in events) and warnings == []


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


# -- config.json and shard indexes of every wrong shape: one line, exit 3 ----------------------


@pytest.mark.parametrize(
    "change,fragment",
    [
        (
            {"num_hidden_layers": 10**9},
            "num_hidden_layers: Input should be less than or equal to 1024",
        ),
        ({"num_hidden_layers": 1e9}, "num_hidden_layers: Input should be a valid integer"),
        ({"hidden_size": 10**7}, "hidden_size: Input should be less than or equal to 65536"),
        ({"vocab_size": 0}, "vocab_size: Input should be greater than or equal to 1"),
        ({"max_position_embeddings": 2**40}, "max_position_embeddings: Input should be less"),
        ({"architectures": 5}, "architectures: Input should be a JSON array (got 5)"),
        ({"rope_parameters": [1]}, "rope_parameters: Input should be a JSON object (got [1])"),
        ({"text_config": "x"}, 'text_config: Input should be a JSON object (got "x")'),
        ({"hidden_act": 1}, "hidden_act: Input should be a JSON string (got 1)"),
        (
            {"num_hidden_layers": "8", "layer_types": None},
            "num_hidden_layers: Input should be a valid integer",
        ),
        ({"rms_norm_eps": "tiny"}, "rms_norm_eps: Input should be a valid number"),
        ({"rms_norm_eps": -1e-6}, "rms_norm_eps: Input should be greater than 0"),
        (
            {"rope_parameters": {"rope_type": "default", "rope_theta": 0}},
            "rope_parameters.rope_theta: Input should be greater than 0 (got 0)",
        ),
        ({"rope_theta": 0}, "rope_theta: Input should be greater than 0 (got 0)"),
        (
            {
                "rope_parameters": {
                    "rope_type": "default",
                    "rope_theta": 1e7,
                    "partial_rotary_factor": 2.0,
                }
            },
            "rope_parameters.partial_rotary_factor: Input should be less than or equal to 1",
        ),
        (
            {"eos_token_id": "0"},
            'eos_token_id: Input should be a token id or a JSON array of token ids (got "0")',
        ),
        ({"eos_token_id": [1, "2"]}, "eos_token_id: Input should be a token id or a JSON array"),
        (
            {"num_key_value_heads": 3},
            "num_attention_heads 4 is not a multiple of num_key_value_heads 3",
        ),
        ({"num_hidden_layers": 2}, "4 layer_types for num_hidden_layers 2"),
        ({"hidden_act": "gelu"}, "hidden_act 'gelu' is not supported (supported: silu, swish)"),
        ({"hidden_act": "relu"}, "hidden_act 'relu' is not supported"),
    ],
)
def test_config_values_of_the_wrong_type_or_size(capsys, pair, tmp_path, change, fragment) -> None:
    model = copy_target(pair, tmp_path)
    cfg = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps(cfg | change))
    started = time.monotonic()
    expect_model_error(capsys, pair, model, fragment)
    assert time.monotonic() - started < 30  # refused before building anything of that size


@pytest.mark.parametrize(
    "text,fragment",
    [
        ("[1, 2, 3]", "expected a JSON object, got list"),
        ('{"n": ' + "9" * 5000 + "}", "not valid JSON (Exceeds the limit (4300 digits)"),
        ("[" * 100000 + "]" * 100000, "not valid JSON (nested too deeply to read)"),
    ],
)
def test_config_json_python_cannot_read(capsys, pair, tmp_path, text, fragment) -> None:
    model = copy_target(pair, tmp_path)
    (model / "config.json").write_text(text)
    expect_model_error(capsys, pair, model, fragment)


@pytest.mark.parametrize("how", ["symlink loop", "directory"])
def test_config_json_that_cannot_be_read(capsys, pair, tmp_path, how) -> None:
    model = copy_target(pair, tmp_path)
    (model / "config.json").unlink()
    if how == "directory":
        (model / "config.json").mkdir()
        fragment = "cannot read config.json (Is a directory)"
    else:
        (model / "config.json").symlink_to("config.json")
        fragment = "cannot read config.json (Too many levels of symbolic links)"
    expect_model_error(capsys, pair, model, f"{model / 'config.json'}: {fragment}")


@pytest.mark.parametrize(
    "index",
    [
        b'{"weight_map": [1, 2]}',
        b'{"weight_map": {"model.embed_tokens.weight": 5}}',
        b'{"weight_map": "\xff"}',
        b"[]",
        b"{}",
    ],
)
def test_shard_index_of_the_wrong_shape(capsys, pair, tmp_path, index) -> None:
    model = copy_target(pair, tmp_path)
    (model / "model.safetensors.index.json").write_bytes(index)
    expect_model_error(capsys, pair, model, "model.safetensors.index.json: ")


def test_shard_index_symlink_loop(capsys, pair, tmp_path) -> None:
    model = copy_target(pair, tmp_path)
    (model / "model.safetensors.index.json").symlink_to("model.safetensors.index.json")
    expect_model_error(capsys, pair, model, "cannot read the shard index (Too many levels")


def test_safetensors_that_is_a_directory(capsys, pair, tmp_path) -> None:
    model = copy_target(pair, tmp_path)
    (model / "model.safetensors").unlink()
    (model / "model.safetensors").mkdir()
    expect_model_error(capsys, pair, model, "is a directory, not a safetensors file")


@pytest.mark.parametrize("name", ["config.json", "model.safetensors"])
def test_a_checkpoint_file_without_read_permission(pair, tmp_path, name) -> None:
    """Mode 000: said as unreadable, not as missing or corrupt. Root reads any file, so the
    CLI runs without the capabilities that let it (setpriv drops them from its bounding set)."""
    setpriv = shutil.which("setpriv")
    if os.geteuid() == 0 and setpriv is None:
        pytest.skip("needs setpriv to run as root without CAP_DAC_OVERRIDE")
    model = copy_target(pair, tmp_path)
    (model / name).chmod(0)
    drop = (
        [setpriv, "--bounding-set", "-dac_override,-dac_read_search"] if os.geteuid() == 0 else []
    )
    cli = "import sys; from specdash.cli import main; sys.exit(main(sys.argv[1:]))"
    args = ["run", "--headless", "--model", str(model), "--drafter", "ngram",
            "--prompts", str(pair[2])]  # fmt: skip
    proc = subprocess.run(
        [*drop, sys.executable, "-c", cli, *args], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == EXIT_CHECKPOINT, proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("specdash: error: "), proc.stderr
    assert str(model / name) in proc.stderr and "Permission denied" in proc.stderr, proc.stderr


def test_a_draft_vocabulary_larger_than_the_targets(capsys, pair, tmp_path) -> None:
    import torch

    draft = tmp_path / "draft"
    shutil.copytree(pair[1], draft)
    tensors = load_file(draft / "model.safetensors")
    cfg = json.loads((draft / "config.json").read_text())
    extra = cfg["vocab_size"]
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        tensors[name] = torch.cat([tensors[name], torch.randn(extra, tensors[name].shape[1])])
    save_file(tensors, draft / "model.safetensors")
    (draft / "config.json").write_text(json.dumps(cfg | {"vocab_size": 2 * extra}))
    args = ["--model", str(pair[0]), "--draft", str(draft), "--prompts", str(pair[2])]
    expect(
        capsys,
        EXIT_CHECKPOINT,
        f"{draft}: the draft's vocabulary ({2 * extra} ids) is larger than the target's ({extra}",
        *args,
    )


def test_an_unknown_preset_is_a_flag_error(capsys) -> None:
    expect_flag_error(
        capsys,
        "--preset: unknown preset 'bogus'; known: qwen3.5-27b-shape, qwen3.5-27b-shape-fp8, "
        "tiny-hybrid, tiny-hybrid-fp8",
        "--preset",
        "bogus",
        "--drafter",
        "ngram",
    )


def test_batch_above_its_bound_is_a_flag_error(capsys) -> None:
    expect_flag_error(
        capsys,
        "--batch: Input should be less than or equal to 4096",
        "--batch",
        "1" + "0" * 29,
    )


def test_a_huge_batch_reserves_only_what_the_prompts_fill(pair, tmp_path) -> None:
    """One prompt at --batch 4096 reserves one sequence's state (and its shadow's), not 4096."""
    prompts = tmp_path / "one.jsonl"
    prompts.write_text('{"prompt": "one prompt"}\n')
    slots = {}
    for batch in (1, 4096):
        settings = SessionSettings(model=pair[0], drafter="ngram", prompts=prompts, batch=batch)
        backend = NativeBackend(settings)
        with contextlib.ExitStack() as stack:
            backend.open(load_prompts(prompts), lambda e: None, stack)
        slots[batch] = len(backend.engine._slots)
    assert slots[4096] == slots[1] == 2


# -- prompt files: read once, whatever they are ------------------------------------------------


def headless_cli(pair, *args: str) -> list[str]:
    return [sys.executable, "-m", "specdash.cli", "run", "--headless", "--max-new-tokens", "4",
            "--drafter", "ngram", "--model", str(pair[0]), "--no-shadow", *args]  # fmt: skip


def test_prompts_from_a_pipe(pair) -> None:
    run = subprocess.run(
        headless_cli(pair, "--prompts", "/dev/stdin"),
        input=pair[2].read_text(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    assert (
        f"prompts                            {len(pair[2].read_text().splitlines())}" in run.stdout
    )


def test_prompts_from_a_fifo(pair, tmp_path) -> None:
    fifo = tmp_path / "prompts.fifo"
    os.mkfifo(fifo)
    proc = subprocess.Popen(
        headless_cli(pair, "--prompts", str(fifo)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    with open(fifo, "w") as writer:  # one writer, once, as a shell's `> fifo` would
        writer.write(pair[2].read_text())
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert "exact prompts" in out


def test_prompts_from_process_substitution(pair) -> None:
    if shutil.which("bash") is None:
        pytest.skip("needs bash")
    command = (
        " ".join(map(shlex.quote, headless_cli(pair, "--prompts")))
        + f" <(cat {shlex.quote(str(pair[2]))})"
    )
    run = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "exact prompts" in run.stdout


@pytest.mark.parametrize("char", ["\u2028", "\u2029", "\u0085", "\x1c"])
def test_a_raw_line_separator_inside_a_prompt_string(capsys, pair, tmp_path, char) -> None:
    path = tmp_path / "u.jsonl"
    path.write_text(
        json.dumps({"prompt": f"a{char}b"}, ensure_ascii=False) + "\n", encoding="utf-8"
    )
    code, err = run_cli(
        capsys, "--model", str(pair[0]), "--drafter", "ngram", "--prompts", str(path)
    )
    assert code == 0, err


# -- traces a reader must not trust ------------------------------------------------------------


@pytest.fixture(scope="module")
def recorded(pair, tmp_path_factory) -> Path:
    trace = tmp_path_factory.mktemp("trace") / "t.jsonl"
    args = ["--model", str(pair[0]), "--draft", str(pair[1]), "--prompts", str(pair[2])]
    code = main(["run", "--headless", "--max-new-tokens", "8", *args, "--trace", str(trace)])
    assert code == 0
    return trace


def edited(trace: Path, out: Path, change) -> Path:
    lines = []
    for line in trace.read_text().splitlines():
        obj = json.loads(line)
        lines.append(change(obj) or json.dumps(obj))
    out.write_text("\n".join(lines) + "\n")
    return out


def huge_k(obj: dict) -> None:
    if obj["kind"] == "verify_step":
        obj["k"], obj["accepted"] = 10**9, 10**9 - 1


def infinite_timing(obj: dict) -> None:
    if obj["kind"] == "verify_step" and obj["step"] == 1:
        obj["verify_s"] = float("inf")


def deep_header(obj: dict) -> str | None:
    if obj["kind"] == "session_start":
        return json.dumps(obj)[:-1] + ', "x": ' + "[" * 100000 + "]" * 100000 + "}"
    return None


def bigint_header(obj: dict) -> str | None:
    if obj["kind"] == "session_start":
        return json.dumps(obj)[:-1] + ', "x": ' + "9" * 5000 + "}"
    return None


def two_headers(obj: dict) -> str | None:
    """Two recordings joined, as `cat a.jsonl b.jsonl` makes them."""
    return json.dumps(obj) + "\n" + json.dumps(obj) if obj["kind"] == "session_start" else None


def schema_v0(obj: dict) -> None:
    if obj["kind"] == "session_start":
        obj["schema_version"] = "specdash/v0"


TRACE_COMMANDS = {
    "export": lambda t, tmp: ["export", str(t), "-o", str(tmp / "out.json")],
    "export csv": lambda t, tmp: ["export", str(t), "--format", "csv", "-o", "-"],
    "report": lambda t, tmp: ["report", str(t), "-o", str(tmp / "out.html")],
    "diff": lambda t, tmp: ["diff", str(t), str(t)],
    "compare": lambda t, tmp: ["compare", "--trace-only", str(t), str(t)],
    "replay": lambda t, tmp: ["replay", str(t)],
}


@pytest.mark.parametrize("command", TRACE_COMMANDS)
@pytest.mark.parametrize(
    "change,fragment",
    [
        (huge_k, "not a specdash event: verify_step.k: Input should be less than or equal to 16"),
        (
            infinite_timing,
            "not a specdash event: verify_step.verify_s: Input should be a finite number",
        ),
        (deep_header, "is not a specdash trace (line 1 is not JSON)"),
        (bigint_header, "is not a specdash trace (line 1 is not JSON)"),
        (two_headers, "bad.jsonl:2: a second session_start header (two recordings joined"),
        (schema_v0, "uses trace schema specdash/v0, which no specdash wrote"),
    ],
)
def test_a_trace_no_session_could_have_written(
    capsys, recorded, tmp_path, command, change, fragment
) -> None:
    if command == "report":
        pytest.importorskip("matplotlib")
    bad = edited(recorded, tmp_path / "bad.jsonl", change)
    code = main(TRACE_COMMANDS[command](bad, tmp_path))
    out, err = capsys.readouterr()
    assert code == EXIT_USAGE, err
    assert err.startswith("specdash: error: ") and len(err.strip().splitlines()) == 1, err
    assert fragment in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.jsonl"]


def test_replay_of_a_huge_k_is_refused_before_the_dashboard(capsys, recorded, tmp_path) -> None:
    bad = edited(recorded, tmp_path / "bad.jsonl", huge_k)
    started = time.monotonic()
    assert main(["replay", str(bad)]) == EXIT_USAGE
    assert "k: Input should be less than or equal to 16" in capsys.readouterr().err
    assert time.monotonic() - started < 30


# -- stdout that cannot take the output --------------------------------------------------------


@pytest.mark.parametrize("command", ["export", "diff", "run"])
@pytest.mark.parametrize("stdout", ["/dev/full", "closed"])
def test_a_full_or_closed_stdout(pair, recorded, command, stdout) -> None:
    args = {
        "export": ["export", str(recorded), "-o", "-"],
        "diff": ["diff", str(recorded), str(recorded)],
        "run": ["run", "--headless", "--max-new-tokens", "2", "--drafter", "ngram",
                "--model", str(pair[0]), "--prompts", str(pair[2]), "--json"],
    }[command]  # fmt: skip
    redirect = "> /dev/full" if stdout == "/dev/full" else ">&-"
    command_line = " ".join(map(shlex.quote, [sys.executable, "-m", "specdash.cli", *args]))
    run = subprocess.run(
        ["sh", "-c", f"{command_line} {redirect}"], capture_output=True, text=True, timeout=120
    )
    assert "Traceback" not in run.stderr and "Exception ignored" not in run.stderr, run.stderr
    reason = "No space left on device" if stdout == "/dev/full" else "it is closed"
    assert run.stderr.splitlines()[-1] == (
        f"specdash: error: cannot write the output to stdout: {reason}"
    ), run.stderr
    assert run.returncode == EXIT_ENVIRONMENT


def test_a_reader_that_stops_early_is_no_error(recorded) -> None:
    args = [sys.executable, "-m", "specdash.cli", "export", str(recorded), "--format", "csv"]
    command = " ".join(map(shlex.quote, [*args, "-o", "-"]))
    run = subprocess.run(
        # `true` has exited long before the export writes: the write meets a closed pipe
        ["bash", "-c", f"set -o pipefail; {command} | true"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.stderr == "" and run.returncode == 0


@pytest.mark.parametrize("flag", ["--trace", "--model", "--prompts", "--draft"])
def test_an_empty_path_is_a_flag_error(capsys, flag) -> None:
    """Not read as "." (`trace . is a directory`)."""
    expect_flag_error(capsys, f"{flag}: expected a path, got an empty string", flag, "")


def test_an_empty_output_is_a_flag_error(capsys, recorded) -> None:
    expect_flag_error(
        capsys,
        "argument -o/--output: expected a path, got an empty string",
        str(recorded),
        "-o",
        "",
        command="export",
    )
    assert not Path(str(recorded).replace(".jsonl", ".perfetto.json")).exists()


def test_report_to_stdout(capsys, recorded, tmp_path, monkeypatch) -> None:
    pytest.importorskip("matplotlib")
    monkeypatch.chdir(tmp_path)
    assert main(["report", str(recorded), "-o", "-"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("<!DOCTYPE html><html>") and out.rstrip().endswith("</html>")
    assert err == "" and list(tmp_path.iterdir()) == []


def test_config_under_reporting_its_layers(capsys, pair, tmp_path) -> None:
    """Four layers of weights, config.json says two: refused, not run as a 2-layer model."""
    model = copy_target(pair, tmp_path)
    cfg = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(
        json.dumps(cfg | {"num_hidden_layers": 2, "layer_types": cfg["layer_types"][:2]})
    )
    expect_model_error(
        capsys,
        pair,
        model,
        "the weights hold layers up to 3, but config.json's num_hidden_layers is 2",
    )


@pytest.mark.parametrize("dtype", ["int64", "bool"])
def test_integer_or_bool_weights(capsys, pair, tmp_path, dtype) -> None:
    import torch

    model = copy_target(pair, tmp_path)
    tensors = load_file(model / "model.safetensors")
    name = "model.layers.3.self_attn.o_proj.weight"
    tensors[name] = tensors[name].to(getattr(torch, dtype))
    save_file(tensors, model / "model.safetensors")
    expect_model_error(capsys, pair, model, f"{name} holds torch.{dtype}, not floats")


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_non_finite_weights(capsys, pair, tmp_path, value) -> None:
    """Refused at load: they would run, every output as exact as its shadow and garbage."""
    model = copy_target(pair, tmp_path)
    tensors = load_file(model / "model.safetensors")
    name = "model.layers.1.mlp.down_proj.weight"
    tensors[name][3, 5] = float(value)
    save_file(tensors, model / "model.safetensors")
    expect_model_error(capsys, pair, model, f"{name} holds NaN or infinite values (as float32)")
