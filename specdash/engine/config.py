"""Model shape: one flat description for the Qwen3 (dense) and Qwen3-Next / Qwen3.5 families.

Read from a Hugging Face `config.json` or built from a named preset. Anything the
engine cannot run exactly as the checkpoint means (MoE, sliding windows, biases,
tied MRoPE sections that differ per axis, quantizations other than block FP8) is refused
here with one clear line.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar, cast

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic_core import PydanticCustomError

from specdash import json_text
from specdash.errors import CheckpointError, FlagError

Family = Literal["qwen3", "qwen3_next", "qwen3_5"]
_ModelT = TypeVar("_ModelT", bound=BaseModel)
LayerType = Literal["linear_attention", "full_attention"]

_ARCHITECTURES: dict[str, Family] = {
    "Qwen3ForCausalLM": "qwen3",
    "Qwen3NextForCausalLM": "qwen3_next",
    "Qwen3_5ForCausalLM": "qwen3_5",
    "Qwen3_5ForConditionalGeneration": "qwen3_5",
}


@dataclass(frozen=True, slots=True)
class Fp8Quantization:
    """A block-FP8 checkpoint's `quantization_config` (Qwen's `*-FP8` form): every linear weight
    float8_e4m3fn with float32 `weight_scale_inv` per 128 x 128 block, activations quantized
    per token and 128-column group at run time, except the modules named in
    `modules_to_not_convert`."""

    not_converted: tuple[str, ...] = ()

    def quantizes(self, name: str) -> bool:
        """Whether tensor `name` is stored in FP8: a projection's weight (the only linears; the
        embedding and lm_head are not) that no `modules_to_not_convert` entry names (a
        substring of the module's name, Hugging Face's rule)."""
        module = name.removesuffix(".weight")
        if module == name or "proj" not in module.rsplit(".", 1)[-1]:
            return False
        return not any(entry in module for entry in self.not_converted)

    def to_hf_dict(self) -> dict[str, Any]:
        return {
            "quant_method": "fp8",
            "fmt": "e4m3",
            "activation_scheme": "dynamic",
            "weight_block_size": [128, 128],
            "modules_to_not_convert": list(self.not_converted),
        }


QWEN35_FP8_NOT_CONVERTED = ("linear_attn.in_proj_a", "linear_attn.in_proj_b")
"""What a Qwen3.5 FP8 checkpoint keeps in bf16 besides the embedding and lm_head: the GDN b and a
projections (48 rows each, no whole 128-row block; SGLang refuses them block-quantized)."""


@dataclass(slots=True)
class ModelConfig:
    family: Family
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1e7
    partial_rotary_factor: float = 1.0
    max_position_embeddings: int = 32768
    tie_word_embeddings: bool = False
    layer_types: list[LayerType] = field(default_factory=list)
    linear_num_key_heads: int = 0
    linear_num_value_heads: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_conv_kernel_dim: int = 4
    weight_prefix: str = "model."
    eos_token_ids: list[int] = field(default_factory=list)
    quantization: Fp8Quantization | None = None

    def __post_init__(self) -> None:
        if not self.layer_types:
            self.layer_types = ["full_attention"] * self.num_hidden_layers
        if len(self.layer_types) != self.num_hidden_layers:
            raise ValueError(
                f"{len(self.layer_types)} layer_types for num_hidden_layers "
                f"{self.num_hidden_layers}"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads {self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads {self.num_key_value_heads}"
            )
        if self.has_gdn and (
            not self.linear_num_key_heads or self.linear_num_value_heads % self.linear_num_key_heads
        ):
            raise ValueError(
                f"linear_num_value_heads {self.linear_num_value_heads} is not a multiple of "
                f"linear_num_key_heads {self.linear_num_key_heads}"
            )
        if self.rotary_dim < 1:
            raise ValueError(
                f"head_dim {self.head_dim} x partial_rotary_factor "
                f"{self.partial_rotary_factor} leaves no rotary dimension"
            )

    @property
    def has_gdn(self) -> bool:
        return "linear_attention" in self.layer_types

    @property
    def gated_attention(self) -> bool:
        """Qwen3-Next / 3.5 attention: q_proj emits [q | gate], output is attn * sigmoid(gate)."""
        return self.family != "qwen3"

    @property
    def zero_centred_norm(self) -> bool:
        """Qwen3-Next / 3.5 RMSNorm scales by (1 + w); Qwen3 scales by w."""
        return self.family != "qwen3"

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def gdn_key_dim(self) -> int:
        return self.linear_num_key_heads * self.linear_key_head_dim

    @property
    def gdn_value_dim(self) -> int:
        return self.linear_num_value_heads * self.linear_value_head_dim

    @property
    def gdn_conv_dim(self) -> int:
        return 2 * self.gdn_key_dim + self.gdn_value_dim

    def num_params(self) -> int:
        h = self.hidden_size
        n = self.vocab_size * h * (1 if self.tie_word_embeddings else 2) + h
        for lt in self.layer_types:
            n += 3 * h * self.intermediate_size + 2 * h
            if lt == "full_attention":
                q_out = (
                    self.num_attention_heads * self.head_dim * (2 if self.gated_attention else 1)
                )
                kv = self.num_key_value_heads * self.head_dim
                n += h * q_out + 2 * h * kv + self.num_attention_heads * self.head_dim * h
                n += 2 * self.head_dim
            else:
                n += h * (self.gdn_conv_dim + self.gdn_value_dim + 2 * self.linear_num_value_heads)
                n += self.gdn_conv_dim * self.linear_conv_kernel_dim
                n += 2 * self.linear_num_value_heads + self.linear_value_head_dim
                n += self.gdn_value_dim * h
        return n

    def to_hf_dict(self) -> dict[str, Any]:
        """A config.json that Hugging Face transformers loads as the same model."""
        arch = {
            "qwen3": ("Qwen3ForCausalLM", "qwen3"),
            "qwen3_next": ("Qwen3NextForCausalLM", "qwen3_next"),
            "qwen3_5": ("Qwen3_5ForCausalLM", "qwen3_5_text"),
        }[self.family]
        d: dict[str, Any] = {
            "architectures": [arch[0]],
            "model_type": arch[1],
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "rms_norm_eps": self.rms_norm_eps,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "hidden_act": "silu",
            "attention_bias": False,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": self.rope_theta,
                "partial_rotary_factor": self.partial_rotary_factor,
            },
            "eos_token_id": self.eos_token_ids[0] if self.eos_token_ids else None,
            "torch_dtype": "float32",
        }
        if self.quantization is not None:
            d["quantization_config"] = self.quantization.to_hf_dict()
        if self.family != "qwen3":
            d |= {
                "layer_types": list(self.layer_types),
                "linear_num_key_heads": self.linear_num_key_heads,
                "linear_num_value_heads": self.linear_num_value_heads,
                "linear_key_head_dim": self.linear_key_head_dim,
                "linear_value_head_dim": self.linear_value_head_dim,
                "linear_conv_kernel_dim": self.linear_conv_kernel_dim,
            }
        if self.family == "qwen3_next":
            d |= {"num_experts": 0, "mlp_only_layers": list(range(self.num_hidden_layers))}
        if self.family == "qwen3_5":
            d["rope_parameters"] |= {"mrope_section": [11, 11, 10], "mrope_interleaved": True}
        return d


def hybrid_layer_types(num_layers: int, interval: int = 4) -> list[LayerType]:
    """Qwen3-Next / 3.5 pattern: layer i is full attention iff (i + 1) % interval == 0."""
    return [
        "full_attention" if (i + 1) % interval == 0 else "linear_attention"
        for i in range(num_layers)
    ]


PRESETS: dict[str, ModelConfig] = {
    "qwen3.5-27b-shape": ModelConfig(
        family="qwen3_5",
        vocab_size=248320,
        hidden_size=5120,
        intermediate_size=17408,
        num_hidden_layers=64,
        num_attention_heads=24,
        num_key_value_heads=4,
        head_dim=256,
        partial_rotary_factor=0.25,
        max_position_embeddings=262144,
        layer_types=hybrid_layer_types(64),
        linear_num_key_heads=16,
        linear_num_value_heads=48,
        linear_key_head_dim=128,
        linear_value_head_dim=128,
    ),
    "tiny-hybrid": ModelConfig(
        family="qwen3_5",
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        partial_rotary_factor=0.25,
        max_position_embeddings=4096,
        layer_types=hybrid_layer_types(4),
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
    ),
}


FP8_SUFFIX = "-fp8"
"""A preset's FP8 form (`qwen3.5-27b-shape-fp8`): its random weights block-quantized as a
block-FP8 checkpoint stores them (for GPU benchmarks; dequantized on the CPU)."""


def preset(name: str) -> ModelConfig:
    from dataclasses import replace

    base = name.removesuffix(FP8_SUFFIX)
    known = [n for p in sorted(PRESETS) for n in (p, p + FP8_SUFFIX)]
    if base not in PRESETS:
        raise FlagError(f"unknown preset {name!r}; known: {', '.join(known)}", setting="preset")
    cfg = replace(PRESETS[base], layer_types=list(PRESETS[base].layer_types))
    if name != base:
        cfg.quantization = Fp8Quantization(QWEN35_FP8_NOT_CONVERTED)
    return cfg


ACTIVATIONS = ("silu", "swish")
"""The MLP activations the engine runs: SiLU, which transformers also spells "swish" (the same
function), the one these families ship with. Any other would run as SiLU and mean another model."""

_Dim = Annotated[int, Field(ge=1, le=1 << 16)]
_Heads = Annotated[int, Field(ge=1, le=1024)]
_GdnDim = Annotated[int, Field(ge=0, le=1 << 16)]
_Positive = Annotated[float, Field(gt=0)]


class _Rope(BaseModel):
    """`rope_parameters` (or the older `rope_scaling`): what the engine reads of it."""

    model_config = ConfigDict(extra="ignore", strict=True, allow_inf_nan=False)

    rope_type: str | None = None
    type: str | None = None
    rope_theta: _Positive | None = None
    partial_rotary_factor: Annotated[float, Field(gt=0, le=1)] | None = None


class _HFConfig(BaseModel):
    """The fields of a config.json the engine reads, with the JSON type and the range each
    must have; sizes are bounded so an absurd one is refused before anything is allocated
    for it. The bounds are far beyond any checkpoint of these families."""

    model_config = ConfigDict(extra="ignore", strict=True, allow_inf_nan=False)

    vocab_size: Annotated[int, Field(ge=1, le=1 << 24)]
    hidden_size: _Dim
    intermediate_size: Annotated[int, Field(ge=1, le=1 << 18)]
    num_hidden_layers: Annotated[int, Field(ge=1, le=1024)]
    num_attention_heads: _Heads
    num_key_value_heads: _Heads | None = None
    head_dim: Annotated[int, Field(ge=1, le=4096)] | None = None
    hidden_act: str = "silu"
    rms_norm_eps: _Positive = 1e-6
    rope_parameters: _Rope | None = None
    rope_scaling: _Rope | None = None
    rope_theta: _Positive | None = None
    partial_rotary_factor: Annotated[float, Field(gt=0, le=1)] | None = None
    max_position_embeddings: Annotated[int, Field(ge=1, le=1 << 20)] = 32768
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    use_sliding_window: bool = False
    num_experts: Annotated[int, Field(ge=0)] = 0
    mlp_only_layers: list[int] = []
    layer_types: list[str] | None = None
    full_attention_interval: Annotated[int, Field(ge=1)] = 4
    linear_num_key_heads: _GdnDim = 0
    linear_num_value_heads: _GdnDim = 0
    linear_key_head_dim: _GdnDim = 0
    linear_value_head_dim: _GdnDim = 0
    linear_conv_kernel_dim: Annotated[int, Field(ge=1, le=64)] = 4
    eos_token_id: int | list[int] | None = None

    @field_validator("eos_token_id", mode="before")
    @classmethod
    def _token_ids(cls, value: object) -> object:
        """Judged whole: the union's own error would name one of its branches
        (`eos_token_id.int`) rather than what the field takes."""

        def token_id(v: object) -> bool:
            return isinstance(v, int) and not isinstance(v, bool)

        if value is None or token_id(value):
            return value
        if isinstance(value, list) and all(token_id(v) for v in value):
            return value
        raise PydanticCustomError(
            "token_ids", "Input should be a token id or a JSON array of token ids"
        )


class _Top(BaseModel):
    """The outer config.json: the architecture, and a multimodal checkpoint's text model."""

    model_config = ConfigDict(extra="ignore", strict=True)

    architectures: list[str] = []
    model_type: str | None = None
    text_config: dict[str, Any] | None = None
    tie_word_embeddings: bool = False


def _validated(model: type[_ModelT], raw: dict[str, Any], cfg_path: Path) -> _ModelT:
    try:
        return model.model_validate(raw)
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        # said in JSON's words: pydantic's name the Python type (or this module's model)
        message = _JSON_TYPES.get(err["type"], err["msg"])
        value = f" (got {_short(err['input'])})" if err["type"] != "missing" else ""
        raise CheckpointError(f"{cfg_path}: {where}: {message}{value}") from None


_JSON_TYPES = {
    "model_type": "Input should be a JSON object",
    "dict_type": "Input should be a JSON object",
    "list_type": "Input should be a JSON array",
    "string_type": "Input should be a JSON string",
}


def _short(value: object) -> str:
    text = json.dumps(value) if not isinstance(value, dict) else "an object"
    return text if len(text) <= 40 else text[:37] + "..."


def read_json(file: Path, what: str) -> Any:
    """A checkpoint's JSON file; every way it cannot be read or parsed is one
    `CheckpointError` naming it (a missing file is the caller's to word)."""
    try:
        return json_text.loads(file.read_bytes())
    except FileNotFoundError:
        raise
    except OSError as e:  # unreadable, a directory, a symlink loop
        raise CheckpointError(f"{file}: cannot read {what} ({e.strerror or e})") from None
    except json_text.JsonTextError as e:
        raise CheckpointError(f"{file}: not valid JSON ({e})") from None


def config_from_hf(path: Path) -> ModelConfig:
    """Parse `path/config.json`; refuse what the native engine does not run."""
    cfg_path = path / "config.json"
    try:
        loaded = read_json(cfg_path, "config.json")
    except FileNotFoundError:
        raise CheckpointError(f"{path}: no config.json (not a Hugging Face checkpoint)") from None
    if not isinstance(loaded, dict):
        raise CheckpointError(f"{cfg_path}: expected a JSON object, got {type(loaded).__name__}")
    top = _validated(_Top, loaded, cfg_path)
    family = next((_ARCHITECTURES[a] for a in top.architectures if a in _ARCHITECTURES), None)
    if family is None:
        raise CheckpointError(
            f"{path}: unsupported architecture {top.architectures or top.model_type!r}; "
            f"supported: {', '.join(_ARCHITECTURES)}"
        )
    prefix = "model."
    quantization = _quantization(loaded.get("quantization_config"), path, family)
    raw = loaded
    if top.text_config is not None:
        raw = top.text_config | {"tie_word_embeddings": top.tie_word_embeddings}
        prefix = "model.language_model."
    c = _validated(_HFConfig, raw, cfg_path)
    if c.hidden_act not in ACTIVATIONS:
        raise CheckpointError(
            f"{cfg_path}: hidden_act {c.hidden_act!r} is not supported "
            f"(supported: {', '.join(ACTIVATIONS)})"
        )
    dense = set(c.mlp_only_layers) == set(range(c.num_hidden_layers))
    if c.num_experts and family == "qwen3_next" and not dense:
        raise CheckpointError(f"{path}: mixture-of-experts layers are not supported yet")
    if c.attention_bias:
        raise CheckpointError(f"{path}: attention_bias=true is not supported")
    if c.use_sliding_window or "sliding_attention" in (c.layer_types or []):
        raise CheckpointError(f"{path}: sliding-window attention is not supported")
    rope = c.rope_parameters or c.rope_scaling or _Rope()
    if (rope.rope_type or rope.type or "default") != "default":
        raise CheckpointError(f"{path}: rope type {rope.rope_type!r} is not supported")
    layer_types: list[str] = list(c.layer_types or [])
    if family != "qwen3" and not layer_types:
        layer_types = [*hybrid_layer_types(c.num_hidden_layers, c.full_attention_interval)]
    unknown = set(layer_types) - {"linear_attention", "full_attention"}
    if unknown:
        raise CheckpointError(f"{path}: unsupported layer types {sorted(unknown)}")
    heads, hidden, eos = c.num_attention_heads, c.hidden_size, c.eos_token_id
    # transformers' Qwen3 rotates the whole head whatever partial_rotary_factor says (its
    # RoPE never reads it); Qwen3-Next / 3.5 rotate a part, a quarter unless told
    partial = (
        1.0 if family == "qwen3" else rope.partial_rotary_factor or c.partial_rotary_factor or 0.25
    )
    try:
        return ModelConfig(
            family=family,
            vocab_size=c.vocab_size,
            hidden_size=hidden,
            intermediate_size=c.intermediate_size,
            num_hidden_layers=c.num_hidden_layers,
            num_attention_heads=heads,
            num_key_value_heads=c.num_key_value_heads or heads,
            head_dim=c.head_dim or hidden // heads,
            rms_norm_eps=c.rms_norm_eps,
            rope_theta=rope.rope_theta or c.rope_theta or 1e6,
            partial_rotary_factor=partial,
            max_position_embeddings=c.max_position_embeddings,
            tie_word_embeddings=c.tie_word_embeddings,
            layer_types=cast("list[LayerType]", layer_types),  # checked above
            linear_num_key_heads=c.linear_num_key_heads,
            linear_num_value_heads=c.linear_num_value_heads,
            linear_key_head_dim=c.linear_key_head_dim,
            linear_value_head_dim=c.linear_value_head_dim,
            linear_conv_kernel_dim=c.linear_conv_kernel_dim,
            weight_prefix=prefix,
            eos_token_ids=[eos] if isinstance(eos, int) else list(eos or []),
            quantization=quantization,
        )
    except ValueError as e:
        raise CheckpointError(f"{path}: inconsistent config.json ({e})") from None


def _quantization(q: Any, path: Path, family: Family) -> Fp8Quantization | None:
    """The block-FP8 form, or None for an unquantized checkpoint; any other quantization, or a
    block size the FP8 tile does not run, refused."""
    if q is None:
        return None
    where = f"{path / 'config.json'}: quantization_config"
    method = q.get("quant_method") if isinstance(q, dict) else None
    if method != "fp8":
        raise CheckpointError(
            f"{where} quant_method {method!r} is not supported by the native engine "
            "(block FP8, quant_method 'fp8' with weight_block_size [128, 128], is)"
        )
    block = q.get("weight_block_size")
    if block is None:
        raise CheckpointError(
            f"{where} has no weight_block_size: per-tensor and per-channel FP8 checkpoints are "
            "not supported by the native engine (block FP8 [128, 128] is)"
        )
    if block != [128, 128]:
        raise CheckpointError(
            f"{where} weight_block_size {block} is not supported (the FP8 GEMM runs [128, 128])"
        )
    if q.get("fmt", "e4m3") != "e4m3" or q.get("activation_scheme", "dynamic") != "dynamic":
        raise CheckpointError(
            f"{where} fmt {q.get('fmt')!r} / activation_scheme {q.get('activation_scheme')!r} "
            "is not supported (e4m3 with dynamic activation scales is)"
        )
    if family == "qwen3_next":
        raise CheckpointError(
            f"{where}: block FP8 is supported for Qwen3 and Qwen3.5 checkpoints, not Qwen3-Next "
            "(its per-head interleaved projections split the scale blocks)"
        )
    skip = q.get("modules_to_not_convert") or q.get("ignored_layers") or []
    return Fp8Quantization(tuple(str(entry) for entry in skip))


def save_hf_config(cfg: ModelConfig, path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(cfg.to_hf_dict(), indent=2) + "\n")
