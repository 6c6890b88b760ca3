"""Tiny random draft/target pairs for the engine tests (built with transformers, loaded natively).

A draft that is a *noisy copy* of its target agrees with it often but not always, so greedy speculation
exercises full acceptance, partial acceptance and immediate rejection in the same run.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

VOCAB = 24  # small, so even an unrelated random draft sometimes matches the target


def tiny_hf_model(arch: str, hidden: int, layers: int, seed: int, layer_types: list[str] | None = None):
    from transformers import AutoModelForCausalLM, Lfm2Config, LlamaConfig

    common = dict(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, pad_token_id=0,
                  bos_token_id=1, eos_token_id=2, tie_word_embeddings=False, initializer_range=0.3)
    if arch == "llama":
        config = LlamaConfig(**common)
    else:
        layer_types = layer_types or ["conv" if i % 2 == 0 else "full_attention" for i in range(layers)]
        config = Lfm2Config(**common, layer_types=layer_types, block_auto_adjust_ff_dim=False,
                            block_ff_dim=2 * hidden, conv_L_cache=3)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager").float().eval()
    with torch.no_grad():
        gen = torch.Generator().manual_seed(seed)
        for name, p in model.named_parameters():
            if "conv.conv" in name:
                p.copy_(0.5 * torch.randn(p.shape, generator=gen))
    return model


def save_tiny(model, out: Path) -> Path:
    model.save_pretrained(out)
    return out


def noisy_copy(src: Path, out: Path, scale: float, seed: int) -> Path:
    """The checkpoint at src with N(0, scale * std(w)) noise on every weight, saved to out."""
    out.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(seed)
    weights = load_file(src / "model.safetensors")
    noisy = {}
    for name, w in weights.items():
        std = w.float().std() if w.numel() > 1 else torch.tensor(1.0)
        noisy[name] = (w.float() + scale * std * torch.randn(w.shape, generator=gen)).to(w.dtype).contiguous()
    save_file(noisy, out / "model.safetensors", metadata={"format": "pt"})
    for f in ("config.json", "generation_config.json"):
        if (src / f).exists():
            (out / f).write_bytes((src / f).read_bytes())
    return out


def random_prompts(lengths, seed: int, vocab: int = VOCAB) -> list[list[int]]:
    """One prompt of random ids in [3, vocab) per length, reproducible from `seed`."""
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (n,), generator=gen).tolist() for n in lengths]


def build_pairs(root: Path) -> dict[str, tuple[Path, Path]]:
    """The engine tests' three pair kinds: LFM2 target + unrelated Llama draft, LFM2 + noisy hybrid copy,
    Llama + noisy copy. Returns {name: (target_dir, draft_dir)}."""
    lfm2 = save_tiny(tiny_hf_model("lfm2", 48, 4, seed=0, layer_types=["conv", "full_attention", "conv", "conv"]),
                     root / "lfm2")
    llama = save_tiny(tiny_hf_model("llama", 48, 2, seed=1), root / "llama")
    llama_draft = save_tiny(tiny_hf_model("llama", 32, 1, seed=2), root / "llama-draft")
    return {
        "lfm2+llama": (lfm2, llama_draft),
        "lfm2+lfm2": (lfm2, noisy_copy(lfm2, root / "lfm2-noisy", 0.35, seed=3)),
        "llama+llama": (llama, noisy_copy(llama, root / "llama-noisy", 0.35, seed=4)),
    }


def second_token_pvalue(target_dir: Path, prompt: list[int], outputs: list[list[int]]) -> float:
    """Chi-square p-value that the second output token of the requests whose first output token is the most common
    one follows the target's next-token distribution p(. | prompt, first), computed by transformers from the
    checkpoint at target_dir. outputs: each request's output token ids (at least 2). Cells expected below 5 are
    pooled into one."""
    from collections import Counter

    from scipy.stats import chisquare
    from transformers import AutoModelForCausalLM

    first, _ = Counter(o[0] for o in outputs).most_common(1)[0]
    seconds = torch.tensor([o[1] for o in outputs if o[0] == first])
    with torch.no_grad():
        hf = AutoModelForCausalLM.from_pretrained(target_dir).float().eval()
        probs = torch.softmax(hf(torch.tensor([prompt + [first]])).logits[0, -1].double(), -1)
    counts = torch.bincount(seconds, minlength=probs.numel()).double()
    expected = probs * counts.sum()
    keep = expected > 5
    obs = torch.cat([counts[keep], counts[~keep].sum().view(1)])
    exp = torch.cat([expected[keep], expected[~keep].sum().view(1)])
    return float(chisquare(obs.numpy(), exp.numpy()).pvalue)
