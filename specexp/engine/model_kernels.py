"""Which kernels an engine's models run: the engine's kernel settings set on the models' module tables."""

from __future__ import annotations

from torch import nn

from specexp.engine.config import EngineConfig
from specexp.models.attention import ATTENTION_KERNELS, use_attention_kernel
from specexp.models.linear_ops import LINEAR_KERNELS, use_linear_ops
from specexp.models.norm_folding import fold_norm_weights
from specexp.models.pointwise import EAGER, compiled_pointwise_ops, use_pointwise_ops
from specexp.models.short_conv_ops import CONV_KERNELS, use_conv_kernel


def use_engine_kernels(models: tuple[nn.Module, ...], engine: EngineConfig) -> None:
    """Make every model of `models` run `engine`'s kernels: the fused (compiled) pointwise ops or the eager ones
    (`compile_pointwise`), its linear-ops table (`linear_kernel`, `silu_in_down_gemv`), attention and short-conv
    kernels; with `fold_norm_weights`, its pre-norm weights folded into the projections first (in place). Set on
    the modules: a model shared by two engines follows the last one built."""
    pointwise = compiled_pointwise_ops() if engine.compile_pointwise else EAGER
    linear = LINEAR_KERNELS[engine.linear_kernel]
    if engine.silu_in_down_gemv:
        linear = linear.with_silu_in_down_gemv()
    for model in models:
        if engine.fold_norm_weights:
            fold_norm_weights(model)
        use_pointwise_ops(model, pointwise)
        use_linear_ops(model, linear)
        use_attention_kernel(model, ATTENTION_KERNELS[engine.attention_kernel])
        use_conv_kernel(model, CONV_KERNELS[engine.conv_kernel])
