"""Patch targets against the real sglang 0.5.17 and 0.5.23 sources: each release's row resolves
with its recorded hashes, apply/remove/re-apply leaves SGLang's objects exactly as found,
`patches check` names the row it checked and reports a renamed target as missing, and the
bad-input paths give one line, not a traceback."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from specdash.cli import main
from specdash.errors import EnvironmentProblem
from specdash.runs.sglang import process
from specdash.runs.sglang.patches import check, installed_source, patch_set, registry


def row_targets(row: str) -> set[str]:
    return {t.path for p in patch_set.all_patches() for t in p.variant(row).targets}


ALL_TARGETS = row_targets("0.5.23")

IDENTITY_SCRIPT = """
from specdash.cli import main
from specdash.runs.sglang.patches import patch_set, registry
import sglang.srt.layers.quantization.fp8_utils as fp8_utils

# SGLang binds fp8_scaled_mm (sgl_kernel's CUTLASS op) only where CUDA is; the FP8 patch
# rebinds that name, so a stand-in takes its place here as CUDA's import would
fp8_utils.fp8_scaled_mm = lambda *args: None
print("EXIT", main(["patches", "check"]))
for path in {t.path for p in patch_set.all_patches() for t in p.targets}:
    try:
        registry.resolve(path)
    except Exception as e:
        print("UNRESOLVED", path, type(e).__name__, getattr(e, "name", ""))

ABSENT = object()

def snapshot():
    out = {}
    for p in patch_set.all_patches():
        for r in p.variant().rebindings:
            if not isinstance(r, registry.Rebinding):  # lazy_dsa_import's module: its own test
                continue
            owner = registry.resolve(r.owner_path)
            out[(r.owner_path, r.name)] = (vars(owner).get(r.name, ABSENT),
                                           getattr(owner, r.name, ABSENT))
    return out

def same(x, y):
    return all(x[key][0] is y[key][0] and x[key][1] is y[key][1] for key in x)

found = snapshot()
patch_set.apply_all()
first = snapshot()
patch_set.apply_all()  # idempotent: a second apply changes nothing
assert same(first, snapshot()), "second apply_all rebound something"
assert all(first[key][1] is not found[key][1] for key in found), "a rebinding did not take"
assert all(p.applied for p in patch_set.all_patches())
patch_set.remove_all()
assert same(found, snapshot()), "remove_all did not restore the original objects"
patch_set.remove_all()  # idempotent
patch_set.apply_all()
assert all(snapshot()[key][1] is not found[key][1] for key in found)
patch_set.remove_all()
assert same(found, snapshot()), "re-apply + remove did not restore the original objects"
print("IDENTITY-OK", len(found))
"""


def report_rows(stdout: str) -> dict[str, str]:
    """`patches check` table: target path -> status."""
    return {
        line.split()[1]: line.split()[0] for line in stdout.splitlines() if line.startswith("  ")
    }


def test_targets_resolve_and_patches_restore_sglang_exactly(run_each_sglang) -> None:
    version = run_each_sglang.version
    out = run_each_sglang(IDENTITY_SCRIPT).stdout
    assert out.startswith(f"sglang {version}: supported; checked against the {version} row")
    rows = report_rows(out)
    targets = row_targets(version)
    assert set(rows) == targets
    assert set(rows.values()) == {"OK"}, rows
    assert f"{len(targets)} OK, 0 changed, 0 missing" in out
    assert "EXIT 0" in out
    unresolved = [line.split()[1:] for line in out.splitlines() if line.startswith("UNRESOLVED")]
    if version == "0.5.23":  # FA3's module needs sgl_kernel (CUDA); 0.5.17 has no FA3 row
        assert unresolved and all(
            ".flashattention_backend.FlashAttentionBackend." in path
            and kind == "ModuleNotFoundError"
            for path, kind, *_ in unresolved
        ), unresolved
    else:
        assert unresolved == []
    # every rebinding of the seven patches (GDN's conv kernel included): 0.5.17 has no
    # launch-config pin, 0.5.23 no DFLASH logprob port
    assert f"IDENTITY-OK {19 if version == '0.5.23' else 21}" in out


RENAMED = (
    "sglang.srt.managers.scheduler_components.batch_result_processor."
    "SchedulerBatchResultProcessor._resolve_spec_v2_tokens"
)
REWRITTEN = (
    "sglang.kernels.ops.attention.linear.fused_sigmoid_gating_recurrent."
    "_select_recurrent_launch_config"
)


def _module_file(root: Path, path: str) -> Path:
    parts = path.split(".")
    return next(
        f
        for cut in range(len(parts), 0, -1)
        if (f := installed_source.module_file(root, parts[:cut])) is not None
    )


def test_patches_check_reports_renamed_target_missing(
    sglang_path, tmp_path, monkeypatch, capsys
) -> None:
    """An SGLang whose files differ from 0.5.23 in two targets: one renamed, one rewritten."""
    wheel = Path(sglang_path.split(os.pathsep)[-1])
    for path in ALL_TARGETS:
        src = _module_file(wheel, path)
        dst = tmp_path / src.relative_to(wheel)
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(src, dst)
    renamed = _module_file(tmp_path, RENAMED)
    text = renamed.read_text()
    renamed.write_text(text.replace("def _resolve_spec_v2_tokens(", "def _resolve_spec_tokens("))
    rewritten = _module_file(tmp_path, REWRITTEN)
    text = rewritten.read_text()
    rewritten.write_text(text.replace("return 4, 1", "return 8, 1", 1))
    monkeypatch.setattr(installed_source, "sglang_root", lambda: tmp_path)
    monkeypatch.setattr(registry, "sglang_version", lambda: "0.5.23")

    with pytest.raises(EnvironmentProblem, match="1 patch targets missing, 1 changed"):
        check.ensure_patchable(force=True)  # a missing target is refused even when forced
    capsys.readouterr()
    assert main(["patches", "check"]) == 4
    rows = report_rows(capsys.readouterr().out)
    assert rows[RENAMED] == "missing" and rows[REWRITTEN] == "changed"
    assert {s for p, s in rows.items() if p not in (RENAMED, REWRITTEN)} == {"OK"}


def test_patches_check_without_sglang_prints_install_hint(monkeypatch, capsys) -> None:
    monkeypatch.setattr(registry, "sglang_version", lambda: None)
    assert main(["patches", "check"]) == 4
    err = capsys.readouterr().err
    assert err == "specdash: error: SGLang is not installed: pip install 'specdash[sglang]'\n"


def _all_ok(monkeypatch) -> None:
    monkeypatch.setattr(
        check,
        "check_targets",
        lambda row: [
            check.TargetStatus("p", t, "replaced", "OK" if row == "0.5.17" else "changed")
            for t in sorted(row_targets(row))
        ],
    )


def test_unchecked_sglang_version_is_refused_unless_forced(monkeypatch, capsys) -> None:
    monkeypatch.setattr(registry, "sglang_version", lambda: "0.6.0")
    monkeypatch.delenv(registry.ROW_ENV, raising=False)
    _all_ok(monkeypatch)
    with pytest.raises(EnvironmentProblem, match="against the 0.5.17 row.*--force-patches"):
        check.ensure_patchable(force=False)
    assert capsys.readouterr().err.startswith(
        "sglang 0.6.0: NOT a supported release (0.5.17, 0.5.23); checked against the row it "
        "matches best, 0.5.17"
    )
    assert check.ensure_patchable(force=True) == "0.5.17"  # the row the patches apply
    assert registry.ROW_ENV not in os.environ  # this process's settings stay as they were
    # the session's SGLang processes get it, for the session only
    with process.session_environment([], None, None, pools_in_turn=False, row="0.5.17"):
        assert registry.patch_row() == "0.5.17"  # what the forced scheduler processes apply
    assert registry.ROW_ENV not in os.environ


def test_sglang_session_without_cuda_is_a_clear_error(monkeypatch, capsys, tmp_path) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    monkeypatch.setattr(registry, "sglang_version", lambda: "0.5.23")
    _all_ok(monkeypatch)
    code = main(["run", "--headless", "--engine", "sglang", "--model", str(tmp_path)])
    assert code == 4
    assert capsys.readouterr().err == (
        "specdash: error: --engine: the SGLang engine needs a CUDA GPU; none is visible to torch\n"
    )


def test_subprocess_exit_code_is_checked(run_sglang) -> None:
    """The helper itself: a failing child fails the test (no silent pass)."""
    with pytest.raises(AssertionError, match="exit 3"):
        run_sglang("import sys; sys.exit(3)")
    assert isinstance(run_sglang("pass"), subprocess.CompletedProcess)


def test_fa3_verify_rows_refuse_a_tree_draft() -> None:
    """0.5.23's FA3 rows read candidates 0..i: on an engine verifying trees (topk > 1, as NGRAM
    at its default breadth) they would be the wrong rows, so they refuse (before touching FA3,
    which needs CUDA) and name the backend that follows trees."""
    from types import SimpleNamespace

    from specdash.runs.sglang.patches.verify_attention_as_decode_rows import fa3_rows

    with pytest.raises(RuntimeError, match="chains only.*topk 10.*attention_backend=triton"):
        fa3_rows(SimpleNamespace(topk=10), None, None, None)
