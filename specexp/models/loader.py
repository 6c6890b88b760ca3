"""Find a model on this machine and build its native module: HF checkpoint, shipped zoo entry, or hub cache.

Never touches the network. `path_or_name` resolves, in order, to
  1. a local directory holding config.json;
  2. a zoo entry: `specexp/zoo/<name>/` (a shipped checkpoint) or `specexp/zoo/configs/<name>/` (config only,
     for `weights="random"`);
  3. a hub id `org/name` already in the local HF cache: `$HF_HUB_CACHE`, `$HF_HOME/hub`,
     `~/.cache/huggingface/hub` -> `models--org--name/snapshots/<rev>/` (rev from refs/main when present).
A miss raises FileNotFoundError naming every place it looked.

The module is built on the meta device and materialised once on the target device in the target dtype
(no throw-away default init), then filled from `*.safetensors` (single file or sharded index) or,
with `weights="random"`, from a seeded normal init (std = initializer_range; norms 1; biases 0);
`weights="auto"` is "trained" where the directory holds safetensors and "random" where it holds only a config.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

from specexp.models.causal_lm import CausalLM
from specexp.models.checkpoint_files import check_safetensors, find_weight_files
from specexp.models.config import ModelConfig
from specexp.models.layers import RMSNorm, RotaryEmbedding
from specexp.models.lfm2 import DepthwiseConvWeights, Lfm2ForCausalLM
from specexp.models.llama import LlamaForCausalLM
from specexp.models.stacked import restack_all

MODEL_CLASSES: dict[str, type[CausalLM]] = {"llama": LlamaForCausalLM, "lfm2": Lfm2ForCausalLM}
ZOO_DIR = Path(__file__).resolve().parents[1] / "zoo"
WEIGHT_MODES = ("auto", "trained", "random")
_DTYPES = {
    "float32": torch.float32, "fp32": torch.float32, "float": torch.float32,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
}
# Checkpoint keys that carry no parameters of ours (recomputed buffers).
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def hf_cache_dirs() -> list[Path]:
    """The HF hub cache directories to search, in priority order (duplicates removed)."""
    dirs = []
    if os.environ.get("HF_HUB_CACHE"):
        dirs.append(Path(os.environ["HF_HUB_CACHE"]))
    if os.environ.get("HF_HOME"):
        dirs.append(Path(os.environ["HF_HOME"]) / "hub")
    dirs.append(Path.home() / ".cache" / "huggingface" / "hub")
    return list(dict.fromkeys(d.expanduser() for d in dirs))


def _cached_snapshot(repo_dir: Path) -> Path | None:
    """The snapshot refs/main points at, else the newest snapshot with a config.json."""
    ref = repo_dir / "refs" / "main"
    if ref.is_file():
        snapshot = repo_dir / "snapshots" / ref.read_text().strip()
        if (snapshot / "config.json").is_file():
            return snapshot
    snapshots = [s for s in (repo_dir / "snapshots").glob("*") if (s / "config.json").is_file()]
    return max(snapshots, key=lambda s: s.stat().st_mtime) if snapshots else None


def resolve_model_dir(path_or_name: str | Path) -> Path:
    """The local directory holding `path_or_name`'s config.json (see module doc for the search order)."""
    name = str(path_or_name)
    looked: list[str] = []
    local = Path(name).expanduser()
    if local.is_dir():
        if (local / "config.json").is_file():
            return local
        raise FileNotFoundError(f"{local} is a directory but has no config.json (not a HF model directory)")
    looked.append(f"local directory {local}")
    for zoo_dir in (ZOO_DIR / name, ZOO_DIR / "configs" / name):
        if (zoo_dir / "config.json").is_file():
            return zoo_dir
        looked.append(f"zoo {zoo_dir}")
    if name.count("/") == 1 and not local.is_absolute():
        repo = "models--" + name.replace("/", "--")
        for cache in hf_cache_dirs():
            snapshot = _cached_snapshot(cache / repo)
            if snapshot is not None:
                return snapshot
            looked.append(f"HF cache {cache / repo}/snapshots/*")
    raise FileNotFoundError(
        f"model {name!r} not found (the network is never used); looked in: " + "; ".join(looked)
    )


def _read_json(path: Path) -> dict:
    with open(path) as f:
        return json.load(f)


def load_config(path_or_name: str | Path) -> ModelConfig:
    """ModelConfig from a model's config.json (+ generation_config.json's eos ids when present)."""
    model_dir = resolve_model_dir(path_or_name)
    generation_path = model_dir / "generation_config.json"
    generation = _read_json(generation_path) if generation_path.is_file() else None
    return ModelConfig.from_hf(_read_json(model_dir / "config.json"), str(path_or_name), generation)


def weight_files(model_dir: Path) -> list[Path]:
    """The safetensors files of a checkpoint (the sharded index's files, model.safetensors, or *.safetensors),
    each checked whole (:func:`specexp.models.checkpoint_files.check_safetensors`) before any is read."""
    files = find_weight_files(model_dir)
    if not files:
        raise FileNotFoundError(
            f"{model_dir} has no *.safetensors weights (pytorch_model.bin is not read); "
            "load it with weights='random' for a randomly initialised model of the same shape"
        )
    for path in files:
        check_safetensors(path)
    return files


def resolve_weights(model_dir: Path, weights: str) -> str:
    """The weights a model gets, "trained" or "random", for `weights` ("auto": "trained" when `model_dir`
    holds safetensors, else "random")."""
    if weights not in WEIGHT_MODES:
        raise ValueError(f"weights={weights!r}; use one of {WEIGHT_MODES}")
    if weights == "auto":
        return "trained" if find_weight_files(model_dir) else "random"
    return weights


def as_dtype(dtype: torch.dtype | str) -> torch.dtype:
    """torch dtype from a dtype or its name ('float32', 'bf16', 'fp16', ...)."""
    if isinstance(dtype, torch.dtype):
        return dtype
    name = str(dtype).removeprefix("torch.")
    if name not in _DTYPES:
        raise ValueError(f"dtype {dtype!r} not supported; use one of {sorted(_DTYPES)}")
    return _DTYPES[name]


def build_model(config: ModelConfig, dtype: torch.dtype, device: torch.device | str) -> CausalLM:
    """The model's module on `device` in `dtype` with uninitialised parameters (rope tables computed)."""
    with torch.device("meta"):
        model = MODEL_CLASSES[config.architecture](config)
    model = model.to(dtype=dtype)
    if torch.device(device).type != "meta":
        _allocate_(model, torch.device(device))
        model.tie_weights()  # parameters are replaced one module at a time: re-share the head
        for module in model.modules():
            if isinstance(module, RotaryEmbedding):
                module.reset_inv_freq()  # float32, whatever the model dtype
    return model


def _allocate_(model: nn.Module, device: torch.device) -> None:
    """Give every parameter and buffer of a meta-built `model` uninitialised storage on `device` (same shapes and
    dtypes), in place. What `nn.Module.to_empty` does, but by `torch.empty`: `to_empty`'s `empty_like` of a meta
    tensor runs torch's Python reference, whose first call imports torch.fx's symbolic shapes (~0.35 s a process
    on a CPU)."""
    for module in model.modules():
        for name, param in list(module.named_parameters(recurse=False)):
            storage = torch.empty(param.shape, dtype=param.dtype, device=device)
            setattr(module, name, nn.Parameter(storage, requires_grad=param.requires_grad))
        for name, buffer in list(module.named_buffers(recurse=False)):
            setattr(module, name, torch.empty(buffer.shape, dtype=buffer.dtype, device=device))


@torch.no_grad()
def init_random_(model: CausalLM, seed: int) -> None:
    """Seeded N(0, initializer_range) weights, unit norm weights, zero biases (in place)."""
    std = model.config.initializer_range
    device = next(model.parameters()).device
    generator = torch.Generator(device=device).manual_seed(seed)
    for module in model.modules():
        if isinstance(module, RMSNorm):
            module.weight.fill_(1.0)
        elif isinstance(module, (nn.Linear, nn.Embedding, DepthwiseConvWeights)):
            module.weight.normal_(0.0, std, generator=generator)
            if getattr(module, "bias", None) is not None:
                module.bias.zero_()


@torch.no_grad()
def load_weights_(model: CausalLM, files: list[Path]) -> None:
    """Copy every checkpoint tensor into the parameter of the same name (cast to its dtype and device).

    Raises on a missing parameter, an unknown checkpoint key or a shape mismatch. With tied embeddings a
    stored `lm_head.weight` is ignored (the embedding matrix is the head, as in transformers).
    """
    params = dict(model.named_parameters(remove_duplicate=False))
    tied = model.config.tie_word_embeddings
    loaded, unexpected = set(), []
    for path in files:
        with safe_open(str(path), framework="pt", device="cpu") as checkpoint:
            for name in checkpoint.keys():
                if name.endswith(_IGNORED_SUFFIXES) or (tied and name == "lm_head.weight"):
                    continue
                if name not in params:
                    unexpected.append(name)
                    continue
                tensor = checkpoint.get_tensor(name)
                if tuple(tensor.shape) != tuple(params[name].shape):
                    raise ValueError(
                        f"{path}: {name} has shape {tuple(tensor.shape)}, its config.json implies "
                        f"{tuple(params[name].shape)}"
                    )
                params[name].copy_(tensor)
                loaded.add(name)
    missing = sorted(set(params) - loaded - ({"lm_head.weight"} if tied else set()))
    if missing or unexpected:
        raise ValueError(
            f"checkpoint {files[0].parent} does not match the {model.config.model_type} architecture: "
            f"missing {missing[:8]}{' ...' if len(missing) > 8 else ''}, "
            f"unexpected {unexpected[:8]}{' ...' if len(unexpected) > 8 else ''}"
        )


def load_model(
    path_or_name: str | Path,
    *,
    dtype: torch.dtype | str = torch.float32,
    device: torch.device | str = "cpu",
    weights: str = "trained",
    seed: int = 0,
) -> CausalLM:
    """The native model of a checkpoint, in eval mode with no parameter requiring grad (an inference model:
    no op of its forward records autograd history).

    weights: "trained" (read *.safetensors), "random" (seeded init, no weight files needed) or "auto"
    (trained when the directory holds safetensors, else random).
    device "meta" builds the module without any storage (for parameter counts).
    """
    model_dir = resolve_model_dir(path_or_name)
    weights = resolve_weights(model_dir, weights)
    config = load_config(model_dir)
    config.name_or_path = str(path_or_name)
    files = weight_files(model_dir) if weights == "trained" else []
    model = build_model(config, as_dtype(dtype), device)
    model.requires_grad_(False)
    if torch.device(device).type == "meta":
        return model.eval()
    if weights == "random":
        init_random_(model, seed)
    else:
        load_weights_(model, files)
    restack_all(model)  # q/k/v and gate/up as single GEMMs from the first forward on
    return model.eval()


def load_tokenizer(path_or_name: str | Path):
    """The checkpoint's `tokenizers.Tokenizer` (from its tokenizer.json)."""
    from tokenizers import Tokenizer

    model_dir = resolve_model_dir(path_or_name)
    path = model_dir / "tokenizer.json"
    if not path.is_file():
        raise FileNotFoundError(f"{model_dir} has no tokenizer.json (config-only zoo entries ship none)")
    return Tokenizer.from_file(str(path))
