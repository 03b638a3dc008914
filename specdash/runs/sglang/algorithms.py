"""Whether the target and draft can run the speculative algorithm asked for, read before any
engine starts from the checkpoints' configs and tensor names and from the installed SGLang's
source (not imported: seconds faster, and the same answer on a machine without a GPU).

Why before: SGLang finds each of these out only after it has spawned its processes and loaded
the weights (a minute at the 27B shape), and then says it in a traceback: EAGLE3 on a target
whose model class cannot capture the hidden states EAGLE3 drafts from (SGLang 0.5.17's
Qwen3.5), DFLASH with a draft that is not a DFlash draft of this target, DFLASH on an SGLang
whose DFLASH aborts every request that asks for logprobs (0.5.17 without the `dflash_logprobs`
patch; specdash compares logprob bits, so each request asks), NEXTN on a checkpoint without
the MTP head it drafts with.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Collection
from pathlib import Path
from typing import Any

from safetensors import safe_open

from specdash.runs.sglang.patches import dflash_logprobs
from specdash.runs.sglang.patches.installed_source import sglang_root
from specdash.runs.sglang.patches.registry import sglang_version

CAPTURE_METHOD = {
    "EAGLE3": "set_eagle3_layers_to_capture",
    "DFLASH": "set_dflash_layers_to_capture",
}
"""The target model-class method each hidden-state drafting algorithm calls at start."""
DFLASH_ARCHITECTURES = ("DFlashDraftModel",)
INSTEAD = "use NEXTN (the checkpoint's MTP head), STANDALONE (a draft model) or NGRAM"
DFLASH_NO_LOGPROBS = "DFLASH speculative decoding does not support return_logprob"
"""What an SGLang whose DFLASH cannot return logprobs says in `dflash_utils.py` (0.5.17)."""


def refusal(kwargs: dict[str, Any], patches: Collection[str]) -> str | None:
    """Why the speculative engine's `sglang.Engine` arguments cannot run their algorithm with
    the named patches applied in its scheduler, or None (also when the checkpoints cannot be
    read here: SGLang then says it itself)."""
    algorithm = kwargs.get("speculative_algorithm")
    target = _config(kwargs.get("model_path"))
    if algorithm is None or target is None:
        return None
    if algorithm in CAPTURE_METHOD:
        arch = (target.get("architectures") or ["?"])[0]
        method = CAPTURE_METHOD[algorithm]
        if class_has_method(arch, method) is False:
            return (
                f"{algorithm} drafts from hidden states the target captures, and SGLang "
                f"{sglang_version()}'s {arch} cannot capture them (it has no {method}): "
                f"{INSTEAD}"
            )
    if algorithm == "DFLASH":
        draft = kwargs.get("speculative_draft_model_path")
        return _dflash_draft_refusal(target, draft) or _dflash_logprob_refusal(patches)
    if algorithm == "NEXTN" and kwargs.get("load_format") != "dummy":
        directory = Path(kwargs.get("speculative_draft_model_path") or kwargs["model_path"])
        names = tensor_names(directory)
        if names is not None and not any(n.startswith("mtp.") for n in names):
            return (
                f"NEXTN drafts with the checkpoint's MTP head (mtp.* tensors) and {directory} "
                "has none: use NGRAM, or STANDALONE with a draft model"
            )
    return None


def _dflash_draft_refusal(target: dict[str, Any], draft_path: str | None) -> str | None:
    # a multimodal checkpoint (Qwen3.5's own: Qwen3_5ForConditionalGeneration) keeps the
    # language model's sizes in its text_config
    target = target.get("text_config") or target
    draft = _config(draft_path)
    if draft is None:
        return "DFLASH needs a DFlash draft checkpoint (a draft directory with its config.json)"
    arch = (draft.get("architectures") or ["?"])[0]
    if arch not in DFLASH_ARCHITECTURES and "dflash_config" not in draft:
        return f"DFLASH needs a DFlash draft; {draft_path} is a {arch}: use STANDALONE for it"
    for key in ("hidden_size", "vocab_size"):
        if draft.get(key) != target.get(key):
            return (
                f"{draft_path} is a DFlash draft of another target: its {key} is "
                f"{draft.get(key)}, the target's {target.get(key)}"
            )
    layers = int(target.get("num_hidden_layers") or 0)
    dflash = draft.get("dflash_config") or {}
    wanted = dflash.get("num_target_layers", draft.get("num_target_layers"))
    ids = dflash.get("target_layer_ids", draft.get("target_layer_ids")) or []
    if (wanted is not None and int(wanted) != layers) or any(int(i) >= layers for i in ids):
        return (
            f"{draft_path} is a DFlash draft of another target: it reads target layers "
            f"{ids or wanted}, and the target has {layers}"
        )
    return None


def _dflash_logprob_refusal(patches: Collection[str]) -> str | None:
    """Why DFLASH returns no logprobs here: the installed SGLang refuses them (0.5.17) and
    the patch that ports 0.5.23's is left off."""
    if dflash_logprobs.PATCH.name in patches:
        return None
    root = sglang_root()
    if root is None:
        return None
    utils = root / "sglang" / "srt" / "speculative" / "dflash_utils.py"
    try:
        text = utils.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    if DFLASH_NO_LOGPROBS not in text:
        return None
    return (
        f"SGLang {sglang_version()}'s DFLASH returns no logprobs (it aborts every request that "
        "asks for them) and specdash compares each token's logprob with the shadow run's: "
        f"leave its patch on (no --sglang-unpatch {dflash_logprobs.PATCH.flag}), use SGLang "
        f"0.5.23, or {INSTEAD}"
    )


def _config(path: str | None) -> dict[str, Any] | None:
    if not path:
        return None
    try:
        return json.loads((Path(path) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def tensor_names(directory: Path) -> list[str] | None:
    """Tensor names of an HF checkpoint (one file or a sharded index), headers only; None when
    it has no safetensors to read."""
    index = directory / "model.safetensors.index.json"
    try:
        if index.is_file():
            return list(json.loads(index.read_text(encoding="utf-8"))["weight_map"])
        files = sorted(directory.glob("*.safetensors"))
        if not files:
            return None
        names: list[str] = []
        for f in files:
            with safe_open(str(f), framework="np") as st:
                names += list(st.keys())
        return names
    except (OSError, ValueError, KeyError):
        return None


def class_has_method(arch: str, method: str) -> bool | None:
    """Whether the installed SGLang's model class for architecture `arch` (the class a module's
    `EntryClass` names, as SGLang's model registry resolves it: other modules may define a
    class of that name for their own use) or one of its base classes defines `method`; None
    when SGLang or the class is not found."""
    root = sglang_root()
    if root is None:
        return None
    models = root / "sglang" / "srt" / "models"
    for file in sorted(models.glob("*.py")):
        module = _parsed(file, arch)
        if module is not None and arch in _entry_classes(module):
            return _defines(models, module, arch, method, seen=set())
    return None


def _parsed(file: Path, name: str) -> ast.Module | None:
    """`file`'s syntax tree, or None where it cannot be read or never mentions `name` (most
    of SGLang's 200-odd model modules: parsing them all would add half a second to a start)."""
    try:
        text = file.read_text(encoding="utf-8", errors="replace")
        return ast.parse(text) if name in text else None
    except (OSError, SyntaxError):
        return None


def _entry_classes(module: ast.Module) -> set[str]:
    """The class names a model module registers (`EntryClass = X` or `= [X, Y]`)."""
    for node in module.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "EntryClass" for t in node.targets
        ):
            values = node.value.elts if isinstance(node.value, ast.List) else [node.value]
            return {v.id for v in values if isinstance(v, ast.Name)}
    return set()


def _defines(models: Path, module: ast.Module, name: str, method: str, seen: set[str]) -> bool:
    """Whether class `name` of `module`, or a base class (followed into the model module it is
    imported from), defines `method`."""
    classes = {n.name: n for n in module.body if isinstance(n, ast.ClassDef)}
    node = classes.get(name)
    if node is None:
        source = _imported_from(module, name)
        imported = _parsed(models / f"{source}.py", name) if source else None
        return imported is not None and _defines(models, imported, name, method, seen)
    if f"{id(module)}:{name}" in seen:
        return False
    seen.add(f"{id(module)}:{name}")
    if any(isinstance(n, ast.FunctionDef) and n.name == method for n in node.body):
        return True
    bases = [b.id for b in node.bases if isinstance(b, ast.Name)]
    return any(_defines(models, module, b, method, seen) for b in bases)


def _imported_from(module: ast.Module, name: str) -> str | None:
    """The sibling model module `name` is imported from (`from sglang.srt.models.X import
    name`), or None."""
    for node in module.body:
        if not isinstance(node, ast.ImportFrom) or node.module is None:
            continue
        if node.module.startswith("sglang.srt.models.") and any(
            alias.name == name and alias.asname is None for alias in node.names
        ):
            return node.module.rpartition(".")[2]
    return None
