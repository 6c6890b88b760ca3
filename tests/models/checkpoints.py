"""Tiny random HF checkpoints for the model tests, built with transformers itself.

Each case names a transformers model class and config overrides; `build_checkpoint` saves a real HF
directory (config.json, model.safetensors, tokenizer.json) and returns the transformers model it saved, in
fp32 eval mode, as the reference. Weights are redrawn larger than transformers' init (std 0.02 would make
every logit ~0 and hide mistakes): linear/embedding N(0, 0.15), conv kernels N(0, 0.4), norm weights
1 + N(0, 0.1), biases N(0, 0.1).
"""

from __future__ import annotations

from pathlib import Path

import torch

VOCAB_SIZE = 320

_LLAMA_BASE = dict(
    vocab_size=VOCAB_SIZE, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=256, bos_token_id=1, eos_token_id=2, pad_token_id=0,
)
_LFM2_BASE = dict(
    vocab_size=VOCAB_SIZE, hidden_size=48, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=256, bos_token_id=1, eos_token_id=2, pad_token_id=0,
)
_LLAMA3_ROPE = dict(rope_type="llama3", rope_theta=10000.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                    original_max_position_embeddings=32)

# case id -> (transformers family, config overrides)
CASES: dict[str, tuple[str, dict]] = {
    "llama-mha-untied": ("llama", dict(num_key_value_heads=4, tie_word_embeddings=False)),
    "llama-gqa-tied-llama3rope": ("llama", dict(tie_word_embeddings=True, rope_parameters=_LLAMA3_ROPE)),
    "qwen2-gqa-qkvbias": ("qwen2", dict(num_key_value_heads=1, tie_word_embeddings=False)),
    "qwen3-qknorm-headdim24": ("qwen3", dict(head_dim=24, attention_bias=True, tie_word_embeddings=True)),
    "lfm2-L3-gqa-tied-cacb": ("lfm2", dict(
        layer_types=["conv", "full_attention", "conv", "full_attention"], conv_L_cache=3, tie_word_embeddings=True,
        block_auto_adjust_ff_dim=True, block_ffn_dim_multiplier=1.0, block_multiple_of=16, intermediate_size=200)),
    "lfm2-L4-mha-untied-bias-acc": ("lfm2", dict(
        num_hidden_layers=3, layer_types=["full_attention", "conv", "conv"], conv_L_cache=4, num_key_value_heads=4,
        tie_word_embeddings=False, conv_bias=True, block_auto_adjust_ff_dim=False)),
    "lfm2-L3-ccac-multiplier": ("lfm2", dict(
        layer_types=["conv", "conv", "full_attention", "conv"], conv_L_cache=3, tie_word_embeddings=False,
        block_auto_adjust_ff_dim=True, block_ffn_dim_multiplier=1.5, block_multiple_of=32)),
    "lfm2-L4-conv-only": ("lfm2", dict(num_hidden_layers=2, layer_types=["conv", "conv"], conv_L_cache=4)),
}


def hf_config(family: str, **overrides):
    from transformers import Lfm2Config, LlamaConfig, Qwen2Config, Qwen3Config

    if family == "lfm2":
        return Lfm2Config(**{**_LFM2_BASE, **overrides})
    config_cls = {"llama": LlamaConfig, "qwen2": Qwen2Config, "qwen3": Qwen3Config}[family]
    return config_cls(**{**_LLAMA_BASE, **overrides})


@torch.no_grad()
def randomize_(model: torch.nn.Module, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    for name, param in model.named_parameters():
        noise = torch.randn(param.shape, generator=generator)
        if "norm" in name:
            param.copy_(1 + 0.1 * noise)
        elif name.endswith("bias"):
            param.copy_(0.1 * noise)
        elif ".conv.conv." in name:
            param.copy_(0.4 * noise)
        else:
            param.copy_(0.15 * noise)


def build_checkpoint(out_dir: Path, family: str, overrides: dict, tokenizer_path: Path | None = None,
                     seed: int = 0, max_shard_size: str | None = None):
    """Save a random transformers model of `family` to `out_dir`; returns the model (fp32, eval)."""
    from transformers import AutoModelForCausalLM

    config = hf_config(family, **overrides)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager").float().eval()
    randomize_(model, seed)
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(out_dir, **kwargs)
    if tokenizer_path is not None:
        (out_dir / "tokenizer.json").write_bytes(Path(tokenizer_path).read_bytes())
    return model


_CORPUS = [
    "Speculative decoding lets a small draft model propose tokens that a large target model verifies.",
    "def add(a, b):\n    return a + b\nfor i in range(10):\n    print(i * i, add(i, 1))",
    "The quick brown fox jumps over the lazy dog. Short convolutions mix nearby tokens cheaply.",
]


def train_tokenizer(path: Path, vocab_size: int = VOCAB_SIZE) -> Path:
    """A byte-level BPE tokenizer.json with exactly `vocab_size` entries (<pad>=0, <bos>=1, <eos>=2)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<pad>", "<bos>", "<eos>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(_CORPUS * 4, trainer=trainer)
    if tokenizer.get_vocab_size() < vocab_size:
        tokenizer.add_tokens([f"<extra_{i}>" for i in range(vocab_size - tokenizer.get_vocab_size())])
    tokenizer.save(str(path))
    return path
