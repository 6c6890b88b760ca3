"""`ModelConfig`: the architecture facts a native model is built from, read from a HF `config.json`.

One flat dataclass for every supported family, so the engine reads the same field names whatever the
model: `layer_types` says per layer whether it is an `"attention"` or a `"conv"` (LFM2 short-conv) layer.
Families differ only in a few switches (`qkv_bias`, `qk_norm`, `conv_L_cache`, ...), filled here from the
HF field names of each `model_type`, including the legacy spellings older checkpoints still carry
(`rope_theta` / `rope_scaling` beside transformers 5's `rope_parameters`, read with transformers'
precedence: see :func:`rope_settings`; LFM2's `full_attn_idxs`, `block_ff_dim`, `tie_embedding`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

# model_type -> native architecture. Everything else is refused with this list.
SUPPORTED_MODEL_TYPES = {"llama": "llama", "qwen2": "llama", "qwen3": "llama", "lfm2": "lfm2"}
SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Lfm2ForCausalLM": "lfm2",
}
SUPPORTED_ROPE_TYPES = ("default", "llama3")
# transformers' per-model default when a config names no rope theta.
_DEFAULT_ROPE_THETA = {"llama": 10_000.0, "qwen2": 10_000.0, "qwen3": 10_000.0, "lfm2": 1_000_000.0}
# transformers' config-class defaults for the fields a config.json may leave out.
_HF_DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": dict(max_position_embeddings=2048, rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2),
    "qwen2": dict(num_key_value_heads=32, max_position_embeddings=32768, rms_norm_eps=1e-6),
    "qwen3": dict(num_key_value_heads=32, head_dim=128, max_position_embeddings=32768, rms_norm_eps=1e-6),
    "lfm2": dict(num_key_value_heads=8, max_position_embeddings=128_000, norm_eps=1e-5, pad_token_id=0,
                 bos_token_id=1, eos_token_id=2, conv_L_cache=3),
}


class UnsupportedModelError(ValueError):
    """The checkpoint's architecture or one of its options has no native implementation."""


@dataclass
class RopeConfig:
    """Rotary embedding settings. `rope_type` "default" or "llama3" (Llama 3.1+ frequency smoothing:
    factor, low_freq_factor, high_freq_factor, original_max_position_embeddings)."""

    theta: float
    rope_type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


@dataclass
class ModelConfig:
    """Shapes and switches of one causal LM (all sizes in elements, not bytes).

    architecture:  "llama" (Llama, Qwen2, Qwen3) or "lfm2".
    model_type:    the HF `model_type` it came from ("llama", "qwen2", "qwen3", "lfm2").
    layer_types:   per layer, "attention" or "conv".
    intermediate_size: the MLP width actually built (LFM2's auto-adjust already applied).
    conv_L_cache:  LFM2 conv kernel length (state keeps conv_L_cache - 1 columns); 0 for models without conv.
    eos_token_ids: every end-of-sequence id (config.json's, plus generation_config.json's when present).
    """

    architecture: str
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    layer_types: list[str]
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope: RopeConfig
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    conv_L_cache: int = 0
    conv_bias: bool = False
    bos_token_id: int | None = None
    eos_token_ids: list[int] = field(default_factory=list)
    pad_token_id: int | None = None
    initializer_range: float = 0.02
    name_or_path: str = ""

    @property
    def eos_token_id(self) -> int | None:
        """The first end-of-sequence id (None when the config names none)."""
        return self.eos_token_ids[0] if self.eos_token_ids else None

    @property
    def num_attention_layers(self) -> int:
        return self.layer_types.count("attention")

    @property
    def num_conv_layers(self) -> int:
        return self.layer_types.count("conv")

    @classmethod
    def from_hf(cls, hf: dict[str, Any], name_or_path: str = "", generation: dict | None = None) -> ModelConfig:
        """Read a HF config.json dict (and optionally generation_config.json's) into a ModelConfig."""
        model_type = _model_type(hf, name_or_path)
        hf = {**_HF_DEFAULTS[model_type], **hf}
        if model_type == "lfm2":
            return _lfm2_config(hf, name_or_path, generation)
        return _llama_config(hf, model_type, name_or_path, generation)


def _supported_list() -> str:
    archs = ", ".join(f"{a} (model_type {t!r})" for a, t in SUPPORTED_ARCHITECTURES.items())
    return f"supported: {archs}"


def _model_type(hf: dict[str, Any], where: str) -> str:
    model_type = hf.get("model_type")
    archs = hf.get("architectures") or []
    if model_type is None and archs:
        model_type = SUPPORTED_ARCHITECTURES.get(archs[0])
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise UnsupportedModelError(
            f"{where or 'config'}: model_type {hf.get('model_type')!r} / architectures {archs} has no native "
            f"implementation; {_supported_list()}"
        )
    unknown = [a for a in archs if a not in SUPPORTED_ARCHITECTURES]
    if unknown:
        raise UnsupportedModelError(f"{where or 'config'}: architectures {unknown} not supported; {_supported_list()}")
    return model_type


def rope_settings(hf: dict[str, Any]) -> dict[str, Any]:
    """The rope dict a config.json means, with transformers 5's precedence: a non-empty legacy `rope_scaling`
    wins over `rope_parameters` as a whole (`RotaryEmbeddingConfigMixin.convert_rope_params_to_dict`), so a
    checkpoint carrying both is the model transformers (and the hf backend) builds."""
    return dict(hf.get("rope_scaling") or hf.get("rope_parameters") or {})


def _rope(hf: dict[str, Any], model_type: str, max_pos: int, where: str) -> RopeConfig:
    """RopeConfig of a config.json: the dict :func:`rope_settings` picks; its `rope_theta`, else the top-level
    `rope_theta`, else the model type's default (as transformers fills it); `rope_type` from `rope_type` or
    the legacy `type`. A rope type the native engine does not implement is refused with the supported list."""
    params = rope_settings(hf)
    if any(isinstance(v, dict) for v in params.values()):
        raise UnsupportedModelError(f"{where}: per-layer-type rope_parameters are not supported")
    theta = params.get("rope_theta", hf.get("rope_theta", _DEFAULT_ROPE_THETA[model_type]))
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise UnsupportedModelError(
            f"{where}: rope_type {rope_type!r} is not implemented by the native engine"
            f" (supported: {', '.join(SUPPORTED_ROPE_TYPES)})"
        )
    partial = params.get("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0))
    if partial not in (None, 1, 1.0):
        raise UnsupportedModelError(f"{where}: partial_rotary_factor {partial} not supported (only 1.0)")
    rope = RopeConfig(theta=float(theta), rope_type=rope_type)
    if rope_type == "llama3":
        missing = [k for k in ("factor", "low_freq_factor", "high_freq_factor") if k not in params]
        if missing:
            raise UnsupportedModelError(f"{where}: rope_type 'llama3' needs {', '.join(missing)} in its rope settings")
        rope.factor = float(params["factor"])
        rope.low_freq_factor = float(params["low_freq_factor"])
        rope.high_freq_factor = float(params["high_freq_factor"])
        rope.original_max_position_embeddings = int(params.get("original_max_position_embeddings", max_pos))
    return rope


def _eos_ids(hf: dict[str, Any], generation: dict | None) -> list[int]:
    ids: list[int] = []
    for source in (hf, generation or {}):
        value = source.get("eos_token_id")
        for token in value if isinstance(value, list) else [value]:
            if token is not None and token not in ids:
                ids.append(int(token))
    return ids


def _common(hf: dict[str, Any], model_type: str, name_or_path: str, generation: dict | None) -> dict[str, Any]:
    hidden = int(hf["hidden_size"])
    heads = int(hf["num_attention_heads"])
    kv_heads = hf.get("num_key_value_heads")
    if hidden % heads and not hf.get("head_dim"):
        raise UnsupportedModelError(f"{name_or_path}: hidden_size {hidden} not divisible by {heads} heads")
    max_pos = int(hf.get("max_position_embeddings", 2048))
    return dict(
        model_type=model_type,
        vocab_size=int(hf["vocab_size"]),
        hidden_size=hidden,
        num_hidden_layers=int(hf["num_hidden_layers"]),
        num_attention_heads=heads,
        num_kv_heads=int(kv_heads if kv_heads is not None else heads),
        head_dim=int(hf.get("head_dim") or hidden // heads),
        rope=_rope(hf, model_type, max_pos, name_or_path),
        max_position_embeddings=max_pos,
        bos_token_id=hf.get("bos_token_id"),
        eos_token_ids=_eos_ids(hf, generation),
        pad_token_id=hf.get("pad_token_id"),
        initializer_range=float(hf.get("initializer_range", 0.02)),
        name_or_path=name_or_path,
    )


def _llama_config(hf: dict[str, Any], model_type: str, name_or_path: str, generation: dict | None) -> ModelConfig:
    act = hf.get("hidden_act", "silu")
    if act != "silu":
        raise UnsupportedModelError(f"{name_or_path}: hidden_act {act!r} not supported (only 'silu')")
    num_layers = int(hf["num_hidden_layers"])
    hf_layer_types = hf.get("layer_types") or ["full_attention"] * num_layers
    sliding = [i for i, t in enumerate(hf_layer_types) if t != "full_attention"]
    if sliding and hf.get("use_sliding_window", True):
        raise UnsupportedModelError(f"{name_or_path}: layers {sliding} use sliding-window attention (not supported)")
    attention_bias = bool(hf.get("attention_bias", False))
    return ModelConfig(
        architecture="llama",
        intermediate_size=int(hf["intermediate_size"]),
        layer_types=["attention"] * num_layers,
        rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        # Qwen2 always has q/k/v biases and no o_proj bias; Llama and Qwen3 follow attention_bias.
        qkv_bias=True if model_type == "qwen2" else attention_bias,
        o_bias=False if model_type == "qwen2" else attention_bias,
        mlp_bias=bool(hf.get("mlp_bias", False)),
        qk_norm=model_type == "qwen3",
        **_common(hf, model_type, name_or_path, generation),
    )


def lfm2_intermediate_size(hf: dict[str, Any]) -> int:
    """LFM2's MLP width: with `block_auto_adjust_ff_dim`, 2/3 of the nominal size, times the multiplier,
    rounded up to `block_multiple_of` (transformers' Lfm2MLP: the rounding only happens with a multiplier)."""
    # As transformers' Lfm2Config: the legacy `block_ff_dim` wins over `intermediate_size`.
    size = int(hf.get("block_ff_dim", hf.get("intermediate_size", 12288)))
    if hf.get("block_auto_adjust_ff_dim", True):
        size = int(2 * size / 3)
        multiplier = hf.get("block_ffn_dim_multiplier", 1.0)
        if multiplier is not None:
            multiple_of = int(hf.get("block_multiple_of", 256))
            size = int(multiplier * size)
            size = multiple_of * math.ceil(size / multiple_of)
    return size


def _lfm2_config(hf: dict[str, Any], name_or_path: str, generation: dict | None) -> ModelConfig:
    num_layers = int(hf["num_hidden_layers"])
    hf_layer_types = hf.get("layer_types")
    if hf_layer_types is None:
        attn_idxs = hf.get("full_attn_idxs")
        attn_idxs = set(range(num_layers) if attn_idxs is None else attn_idxs)
        hf_layer_types = ["full_attention" if i in attn_idxs else "conv" for i in range(num_layers)]
    unknown = sorted({t for t in hf_layer_types if t not in ("full_attention", "conv")})
    if unknown or len(hf_layer_types) != num_layers:
        raise UnsupportedModelError(
            f"{name_or_path}: layer_types must be {num_layers} of 'full_attention'|'conv', got {hf_layer_types}"
        )
    tie = hf.get("tie_embedding", hf.get("tie_word_embeddings", True))  # legacy key wins, as in Lfm2Config
    return ModelConfig(
        architecture="lfm2",
        intermediate_size=lfm2_intermediate_size(hf),
        layer_types=["attention" if t == "full_attention" else "conv" for t in hf_layer_types],
        rms_norm_eps=float(hf.get("norm_eps", 1e-5)),
        tie_word_embeddings=bool(tie),
        qk_norm=True,
        conv_L_cache=int(hf.get("conv_L_cache", 3)),
        conv_bias=bool(hf.get("conv_bias", False)),
        **_common(hf, "lfm2", name_or_path, generation),
    )
