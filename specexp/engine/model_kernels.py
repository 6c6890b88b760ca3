"""Which kernels an engine's models run: the engine's kernel settings set on the models' module tables."""

from __future__ import annotations

import torch
from torch import nn

from specexp.engine.config import MODEL_ROLES, EngineConfig, EngineConfigError
from specexp.models import triton_support
from specexp.models.attention import ATTENTION_KERNELS, use_attention_kernel
from specexp.models.linear_ops import linear_kernel_ops, use_linear_ops
from specexp.models.norm_folding import fold_norm_weights
from specexp.models.pointwise import EAGER, compiled_pointwise_ops, use_pointwise_ops
from specexp.models.short_conv_ops import CONV_KERNELS, use_conv_kernel


def use_engine_kernels(models: tuple[nn.Module, ...], engine: EngineConfig) -> None:
    """Make every model of `models` (the target, then the draft if any) run `engine`'s kernels: the fused
    (compiled) pointwise ops or the eager ones (`compile_pointwise`), its linear-ops table (`linear_kernel`,
    `silu_in_down_gemv`, `silu_in_gate_up` where it names the model), attention and short-conv kernels (their
    Triton kernels launched early with `programmatic_launch`, a model's one-row GEMVs only where
    `gemv_early_launch` names it, its skinny kernels only where `skinny_early_launch` does); with
    `fold_norm_weights`, its pre-norm weights folded into the projections first (in place). Set on the modules:
    a model shared by two engines follows the last one built. On a GPU, Triton's kernel cache is pointed at
    inductor's first (`triton_support.share_inductor_kernel_cache`: the process environment's TRITON_CACHE_DIR,
    unless set).

    Raises EngineConfigError when `programmatic_launch` is true and the engine's GPU cannot launch that way
    (compute capability below 9.0); "auto" launches early only where it can (`EngineConfig.launches_early`)."""
    device = torch.device(engine.device)
    if engine.programmatic_launch is True and device.type != "cuda":
        raise EngineConfigError(f"engine.programmatic_launch=true needs a CUDA GPU (engine.device={device.type}): "
                                "set it false or auto")
    if engine.programmatic_launch is True and not triton_support.programmatic_launch(device):
        index = triton_support.cuda_index(device)
        major, minor = torch.cuda.get_device_capability(index)
        raise EngineConfigError(f"engine.programmatic_launch=true needs a GPU of compute capability 9.0 or later "
                                f"(Hopper); cuda:{index} is {major}.{minor}: set it false")
    triton_support.share_inductor_kernel_cache(device)  # before any kernel compiles
    early = engine.launches_early()
    pointwise = compiled_pointwise_ops() if engine.compile_pointwise else EAGER
    attention, conv = ATTENTION_KERNELS[engine.attention_kernel], CONV_KERNELS[engine.conv_kernel]
    if early:
        attention, conv = attention.launched_early(), conv.launched_early()
    for model, role in zip(models, MODEL_ROLES):
        linear = linear_kernel_ops(engine.linear_kernel, early, engine.skinny_early_launch in (role, "both"),
                                   engine.gemv_early_launch in (role, "both"))
        if engine.silu_in_down_gemv:
            linear = linear.with_silu_in_down_gemv()
        if engine.silu_in_gate_up in (True, role):
            linear = linear.with_silu_in_gate_up()
        if engine.fold_norm_weights and fold_norm_weights(model) and early:
            # An early-launched GEMV reads its first weight chunk before it waits for the kernel before it: the
            # folding kernels' writes must be complete before the first one launches.
            torch.cuda.synchronize(device)
        use_pointwise_ops(model, pointwise)
        use_linear_ops(model, linear)
        use_attention_kernel(model, attention)
        use_conv_kernel(model, conv)
