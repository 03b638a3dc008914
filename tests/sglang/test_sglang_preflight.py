"""Why SGLang cannot start, in one line that says what to do: before the start from the
settings (more GPUs than visible, a kernel module the install lacks), after it from the
traceback of a scheduler that died (which module was missing, who imported it, what avoids it).
The traceback is a real one: SGLang 0.5.17's STANDALONE with CUDA graphs on a GPU without
deep_gemm, where lazy_dsa_import is not applied."""

from __future__ import annotations

from pathlib import Path

import pytest

from specdash.errors import EnvironmentProblem
from specdash.runs.sglang.preflight import check_can_start, explain_failure, refusal

SITE = "/tmp/site/sglang/srt"
DEEP_GEMM_TRACEBACK = f"""Scheduler hit an exception: Traceback (most recent call last):
  File "{SITE}/managers/scheduler.py", line 6320, in run_scheduler_process
    scheduler = Scheduler(
  File "{SITE}/speculative/eagle_worker_v2.py", line 1080, in init_cuda_graphs
    self.draft_worker.init_cuda_graphs()
  File "{SITE}/speculative/eagle_worker_v2.py", line 417, in _capture_cuda_graphs
    from sglang.srt.layers.attention.dsa_backend import (
  File "{SITE}/layers/attention/dsa_backend.py", line 90, in <module>
    import deep_gemm
ModuleNotFoundError: No module named 'deep_gemm'
"""


def test_missing_module_in_a_graph_capture_names_importer_and_the_way_around() -> None:
    assert explain_failure(DEEP_GEMM_TRACEBACK) == (
        "ModuleNotFoundError: No module named 'deep_gemm', imported by "
        "sglang.srt.layers.attention.dsa_backend; SGLang imports it while capturing CUDA "
        "graphs: install deep_gemm, or --sglang-arg disable_cuda_graph=true avoids the import"
    )


def test_missing_module_elsewhere_and_other_errors() -> None:
    text = DEEP_GEMM_TRACEBACK.replace("init_cuda_graphs", "init_model").replace(
        "_capture_cuda_graphs", "load_model"
    )
    assert explain_failure(text).endswith(
        "dsa_backend; install deep_gemm or choose settings that do not need it"
    )
    oom = "Scheduler hit an exception: Traceback\n  ...\nValueError: not enough memory for KV\n"
    assert explain_failure(oom) == "ValueError: not enough memory for KV"


def test_more_gpus_than_visible_is_refused_before_the_start(monkeypatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    assert refusal({"tp_size": 2}, gpus=1) == (
        "tp_size=2 needs 2 GPUs; torch sees 1 (CUDA_VISIBLE_DEVICES=0): "
        "use --sglang-arg tp_size=1 or a machine with 2 GPUs"
    )
    assert refusal({"tp_size": 2}, gpus=2) is None
    with pytest.raises(EnvironmentProblem, match="^sglang cannot start here: tp_size=4 needs"):
        check_can_start({"tp_size": 4}, gpus=2)


def test_a_kernel_module_the_install_lacks_is_refused_with_the_default_to_use() -> None:
    # this machine has no sgl_kernel: FA3's module cannot be found
    assert refusal({"attention_backend": "fa3"}, gpus=1) == (
        "attention_backend=fa3 needs sgl_kernel's FA3 kernels (Python module "
        "'sgl_kernel.flash_ops'), which this SGLang install lacks: use attention_backend=triton "
        "(specdash's default)"
    )
    assert refusal({"attention_backend": "triton"}, gpus=1) is None


def test_headless_refuses_before_any_engine_starts(monkeypatch, capsys, tmp_path) -> None:
    """The session's own check: both engines' arguments judged, one line, exit 4, no start."""
    import torch

    from specdash.cli import main
    from specdash.runs.sglang import process
    from specdash.runs.sglang.patches import check

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(check, "require_sglang", lambda: "0.5.17")
    monkeypatch.setattr(check, "ensure_patchable", lambda force: "0.5.17")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(process, "start_engine", lambda *a, **k: pytest.fail("an engine started"))
    argv = ["run", "--headless", "--engine", "sglang", "--model", str(tmp_path)]
    assert main([*argv, "--sglang-arg", "tp_size=2"]) == 4
    assert capsys.readouterr().err == (
        "specdash: error: sglang cannot start here: tp_size=2 needs 2 GPUs; torch sees 1: "
        "use --sglang-arg tp_size=1 or a machine with 2 GPUs\n"
    )


def _checkpoint(directory, tensors) -> str:
    from safetensors.torch import save_file

    directory.mkdir()
    (directory / "config.json").write_text('{"architectures": ["Qwen3_5ForCausalLM"]}')
    save_file(tensors, str(directory / "model.safetensors"))
    return str(directory)


def test_non_finite_weights_are_refused_before_any_engine_starts(
    monkeypatch, capsys, tmp_path
) -> None:
    """SGLang loads the weights itself, so the session reads them first: a NaN or an infinity
    anywhere (a bf16 weight, an FP8 block scale), in any slice of rows, is one line, exit 3,
    and no engine starts; integer tensors and finite weights pass."""
    import torch

    from specdash.cli import main
    from specdash.engine import checkpoint
    from specdash.runs.sglang import process
    from specdash.runs.sglang.patches import check

    monkeypatch.setattr(check, "require_sglang", lambda: "0.5.17")
    monkeypatch.setattr(check, "ensure_patchable", lambda force: "0.5.17")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(process, "start_engine", lambda *a, **k: pytest.fail("an engine started"))
    monkeypatch.setattr(checkpoint, "SCAN_ELEMENTS", 64)  # rows 0..7 of 8 x 8: eight slices
    weight = torch.randn(64, 8, dtype=torch.bfloat16)
    nan, inf_scale = weight.clone(), torch.ones(1, 1)
    nan[61, 5] = float("nan")
    inf_scale[0, 0] = float("inf")
    fine = {"a.weight": weight, "positions": torch.arange(64)}
    cases = {
        "nan": ({**fine, "b.weight": nan}, "b.weight holds NaN or infinite values (as bfloat16)"),
        "inf": ({**fine, "s.weight_scale_inv": inf_scale}, "s.weight_scale_inv holds NaN"),
    }
    for name, (tensors, reason) in cases.items():
        model = _checkpoint(tmp_path / name, tensors)
        argv = ["run", "--headless", "--engine", "sglang", "--model", model]
        assert main([*argv, "--speculative-algorithm", "NGRAM"]) == 3, name
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("specdash: error: "), err
        assert f"{model}/model.safetensors: {reason}" in err, err
    assert checkpoint.refuse_non_finite_weights(Path(_checkpoint(tmp_path / "ok", fine))) is None
