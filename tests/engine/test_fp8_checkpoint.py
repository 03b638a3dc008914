"""Block-FP8 checkpoints in the native engine: a tiny one written as Qwen ships them (float8_e4m3fn
weights, float32 `weight_scale_inv` per 128 x 128 block, the GDN b/a projections unquantized),
dequantized exactly on the CPU and run exact there; the FP8 tile's model path (the GPU's GEMMs,
through Triton's interpreter) keeps verify rows equal to decode rows; bad FP8 input is one line,
exit 3.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from tiny_models import PROMPTS, build_tokenizer

from specdash.cli import main
from specdash.engine.checkpoint import load_checkpoint, save_checkpoint
from specdash.engine.config import QWEN35_FP8_NOT_CONVERTED, Fp8Quantization, preset
from specdash.engine.model import Model, random_tensors
from specdash.engine.rows import row_implementations
from specdash.engine.state import SeqState
from specdash.errors import EXIT_CHECKPOINT, EXIT_USAGE
from specdash.kernels import gemm_backends
from specdash.kernels.fp8 import FP8, Fp8Weight, dequantize

# every GEMM's K a multiple of 128 (the FP8 tile's K step): hidden 128, o_proj K = 4 x 32,
# GDN out_proj K = 4 x 32, down K = 256; k/v (64 rows each) fuse into q|k|v off the 128 grid
CFG = replace(
    preset("tiny-hybrid"),
    hidden_size=128,
    intermediate_size=256,
    head_dim=32,
    linear_key_head_dim=32,
    linear_value_head_dim=32,
    max_position_embeddings=256,
    eos_token_ids=[],
    quantization=Fp8Quantization(QWEN35_FP8_NOT_CONVERTED),
)
A_B = ("in_proj_a.weight", "in_proj_b.weight")
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")


@pytest.fixture(scope="module")
def fp8_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tok = build_tokenizer()
    cfg = replace(CFG, vocab_size=tok.get_vocab_size())
    root = tmp_path_factory.mktemp("fp8")
    save_checkpoint(root / "model", cfg, random_tensors(cfg, 0), tok)
    (root / "prompts.jsonl").write_text(
        "".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS[:4])
    )
    return root


def test_the_checkpoint_is_laid_out_as_qwen_ships_fp8(fp8_dir: Path) -> None:
    config = json.loads((fp8_dir / "model" / "config.json").read_text())
    assert config["quantization_config"] | {"modules_to_not_convert": []} == {
        "quant_method": "fp8",
        "fmt": "e4m3",
        "activation_scheme": "dynamic",
        "weight_block_size": [128, 128],
        "modules_to_not_convert": [],
    }
    with safe_open(fp8_dir / "model" / "model.safetensors", "pt") as f:
        names = set(f.keys())  # noqa: SIM118 (safe_open has no __iter__)
        qkv = "model.layers.0.linear_attn.in_proj_qkv.weight"
        assert f.get_tensor(qkv).dtype == FP8
        assert f.get_tensor(qkv + "_scale_inv").dtype == torch.float32
        assert f.get_tensor(qkv + "_scale_inv").shape == (2, 1)  # 256 x 128
        for name in A_B:
            assert f.get_tensor(f"model.layers.0.linear_attn.{name}").dtype == torch.float32
            assert f"model.layers.0.linear_attn.{name}_scale_inv" not in names
        for name in ("model.embed_tokens.weight", "lm_head.weight"):
            assert f.get_tensor(name).dtype == torch.float32 and name + "_scale_inv" not in names


def test_cpu_load_dequantizes_exactly(fp8_dir: Path) -> None:
    """Each FP8 weight becomes q * scale in fp32, block by block (one rounding), its scales
    dropped; the unquantized tensors load as stored."""
    stored = load_file(fp8_dir / "model" / "model.safetensors")
    _, tensors, _ = load_checkpoint(fp8_dir / "model", torch.float32, "cpu")
    assert not any(n.endswith("_scale_inv") for n in tensors)
    down = "model.layers.1.mlp.down_proj.weight"
    q, s = stored[down], stored[down + "_scale_inv"]
    assert torch.equal(tensors[down], dequantize(q, s))
    assert torch.equal(tensors[down][:, 128:], q[:, 128:].float() * s[0, 1])  # the second block
    b = "model.layers.0.linear_attn.in_proj_b.weight"
    assert torch.equal(tensors[b], stored[b])


@pytest.mark.parametrize("batch", ["1", "3"])
def test_cpu_run_of_an_fp8_checkpoint_is_exact(capsys, fp8_dir: Path, batch: str) -> None:
    code = main(
        ["run", "--headless", "--json", "--model", str(fp8_dir / "model"), "--drafter", "ngram",
         "--prompts", str(fp8_dir / "prompts.jsonl"), "--max-new-tokens", "12", "--batch", batch]
    )  # fmt: skip
    summary = json.loads(capsys.readouterr().out)
    assert code == 0
    assert summary["exact_prompts"] == summary["prompts"] == 4, summary


# ------------------------------------------------------- the FP8 tile's model path, interpreted


@pytest.fixture(scope="module")
def fp8_model() -> Model:
    """FP8 weights as CUDA keeps them, the GEMMs on `triton-fp8` and the GPU's row kernels, all
    through the interpreter."""
    fp8 = gemm_backends.gpu_backends()["triton-fp8"]
    cfg = replace(CFG, vocab_size=256)
    m = Model.from_tensors(cfg, random_tensors(cfg, 3), fp8)
    m.rows = row_implementations(cfg, m.rope, torch.device("cuda"))
    return m


@pytest.mark.skipif(torch.cuda.is_available(), reason="interpreter test; on CUDA: test_gpu_fp8")
def test_fp8_model_verify_rows_equal_decode_rows(fp8_model: Model) -> None:
    layer = fp8_model.layers[0]
    assert isinstance(layer.mixer.proj, Fp8Weight) and layer.mixer.proj.rest is not None  # b|a
    assert isinstance(fp8_model.layers[3].mixer.qkv, Fp8Weight)  # q|k|v, scales per row
    assert fp8_model.has_fp8
    gen = torch.Generator().manual_seed(4)
    prompt = torch.randint(0, 256, (7,), generator=gen)
    tokens = torch.randint(0, 256, (4,), generator=gen)

    def prefilled() -> SeqState:
        state = SeqState.empty(fp8_model.cfg, 32, torch.float32, torch.device("cpu"))
        fp8_model.forward(prompt, state, "prefill")
        return state

    verify = fp8_model.forward(tokens, prefilled(), "exact")
    decode_state = prefilled()
    for r in range(4):
        row = fp8_model.forward(tokens[r : r + 1], decode_state, "exact")
        decode_state.commit(1)
        assert torch.equal(row[0], verify[r]), f"row {r}"


# ------------------------------------------------------------------------------ bad FP8 input


def _broken(fp8_dir: Path, tmp_path: Path, edit) -> Path:  # noqa: ANN001
    model = tmp_path / "model"
    shutil.copytree(fp8_dir / "model", model)
    tensors = load_file(model / "model.safetensors")
    config = json.loads((model / "config.json").read_text())
    edit(tensors, config)
    save_file(tensors, model / "model.safetensors")
    (model / "config.json").write_text(json.dumps(config))
    return model


DOWN = "model.layers.1.mlp.down_proj.weight"


def _drop_scale(t: dict, c: dict) -> None:
    del t[DOWN + "_scale_inv"]


def _bad_scale_shape(t: dict, c: dict) -> None:
    t[DOWN + "_scale_inv"] = torch.ones(1, 1)


def _unquantized_weight(t: dict, c: dict) -> None:
    t[DOWN] = t[DOWN].float()


def _block_size(t: dict, c: dict) -> None:
    c["quantization_config"]["weight_block_size"] = [64, 64]


def _per_channel(t: dict, c: dict) -> None:
    del c["quantization_config"]["weight_block_size"]


def _other_method(t: dict, c: dict) -> None:
    c["quantization_config"] = {"quant_method": "awq", "bits": 4}


@pytest.mark.parametrize(
    "edit,fragment",
    [
        (_drop_scale, f"missing tensor {DOWN}_scale_inv"),
        (_bad_scale_shape, f"{DOWN}_scale_inv has shape (1, 1), "),
        (_unquantized_weight, f"{DOWN} is float32; its quantization_config makes it float8"),
        (_block_size, "weight_block_size [64, 64] is not supported"),
        (_per_channel, "has no weight_block_size"),
        (_other_method, "quant_method 'awq' is not supported"),
    ],
)
def test_bad_fp8_input_is_one_line_exit_3(capsys, fp8_dir, tmp_path, edit, fragment) -> None:
    model = _broken(fp8_dir, tmp_path, edit)
    code = main(
        ["run", "--headless", "--model", str(model), "--drafter", "ngram", "--prompts",
         str(fp8_dir / "prompts.jsonl"), "--max-new-tokens", "2"]
    )  # fmt: skip
    err = capsys.readouterr().err.strip()
    assert code == EXIT_CHECKPOINT, err
    assert len(err.splitlines()) == 1 and err.startswith("specdash: error: "), err
    assert fragment in err, err


def test_fp8_preset_is_named_and_its_form_is_block_fp8() -> None:
    cfg = preset("qwen3.5-27b-shape-fp8")
    assert cfg.quantization == Fp8Quantization(QWEN35_FP8_NOT_CONVERTED)
    assert preset("qwen3.5-27b-shape").quantization is None
    q = cfg.quantization
    assert q.quantizes("model.layers.0.linear_attn.in_proj_qkv.weight")
    assert q.quantizes("model.layers.3.self_attn.o_proj.weight")
    assert not q.quantizes("model.layers.0.linear_attn.in_proj_b.weight")
    assert not q.quantizes("lm_head.weight") and not q.quantizes("model.embed_tokens.weight")
    assert not q.quantizes("model.layers.0.linear_attn.conv1d.weight")
    code = main(["run", "--headless", "--preset", "nope-fp8", "--drafter", "ngram"])
    assert code == EXIT_USAGE  # an unknown preset is a flag error, FP8 form or not


def test_a_backend_without_fp8_gemms_is_refused_for_an_fp8_model(monkeypatch) -> None:
    """On CUDA a block-FP8 model needs `triton-fp8` (auto picks it); another, named, is refused
    before the weights are read."""
    from specdash.engine import loader

    fp8_cfg = preset("qwen3.5-27b-shape-fp8")
    cuda = torch.device("cuda")
    triton = gemm_backends.gpu_backends()["triton"]
    assert loader._fp8_gemm(fp8_cfg, triton, True, cuda).name == "triton-fp8"
    assert loader._fp8_gemm(preset("tiny-hybrid"), triton, False, cuda) is triton
    assert loader._fp8_gemm(fp8_cfg, triton, False, torch.device("cpu")) is triton
    with pytest.raises(Exception, match="runs no FP8 weights") as exc:
        loader._fp8_gemm(fp8_cfg, triton, False, cuda)
    assert getattr(exc.value, "exit_code", EXIT_USAGE) == EXIT_USAGE


@pytest.mark.skipif(torch.cuda.is_available(), reason="the model on the CPU, its GEMMs interpreted")
def test_switching_an_fp8_model_to_a_backend_without_fp8_gemms_is_refused(fp8_model) -> None:
    """The dashboard's GEMM toggle on an FP8 model: a backend that runs no FP8 weights is
    refused (a non-fatal error saying why) and the model keeps its backend."""
    from specdash.engine.loader import Loaded
    from specdash.engine.tokenizer import ByteTokenizer
    from specdash.events import EngineError
    from specdash.runs.native import NativeBackend
    from specdash.settings import SessionSettings

    loaded = Loaded(fp8_model, None, ByteTokenizer(256), [], {})
    backend = NativeBackend(SessionSettings(drafter="ngram"), loaded)
    events: list = []
    backend._emit = events.append
    assert backend.apply("gemm_backend", "torch") is False
    assert fp8_model.gemm.name == "triton-fp8"
    (error,) = events
    assert isinstance(error, EngineError) and not error.fatal
    assert "runs no FP8 weights; triton-fp8 does" in error.message


def test_the_sglang_builders_fp8_checkpoint_loads_natively(tmp_path, monkeypatch) -> None:
    """`benchmarks/sglang_checkpoint.py --fp8-block` (the checkpoint the SGLang FP8 runs use,
    an MTP head and per-layer `modules_to_not_convert` entries) loads in the native engine too:
    each FP8 weight dequantized exactly, the listed GDN projections as stored."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from sglang_checkpoint import build

    target, _ = build(tmp_path, layers=4, fp8_block=True)
    cfg, tensors, _ = load_checkpoint(target, torch.float32, "cpu")
    assert cfg.quantization is not None and "lm_head" in cfg.quantization.not_converted
    stored = load_file(target / "model.safetensors")
    for name in ("model.layers.0.mlp.down_proj.weight", "model.layers.3.self_attn.q_proj.weight"):
        assert stored[name].dtype == FP8
        assert torch.equal(tensors[name], dequantize(stored[name], stored[name + "_scale_inv"]))
    b = "model.layers.0.linear_attn.in_proj_b.weight"
    assert torch.equal(tensors[b], stored[b].float())
