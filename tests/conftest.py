"""Generic fixtures: tiny random Hugging Face checkpoints (Llama and LFM2) with a small trained tokenizer.

Every checkpoint is a real HF directory (config.json, model.safetensors, tokenizer.json) built in a
temporary directory, small enough (hidden 32-64, 2 layers) that CPU tests stay fast.

Fixtures (scoped to the whole test run, so each checkpoint is built once per run):
- ``tiny_tokenizer_path``: a byte-level BPE ``tokenizer.json`` (vocab ``TINY_VOCAB_SIZE``) with ``<bos>``
  prepended by its post-processor; ``<pad>``=0, ``<bos>``=1, ``<eos>``=2.
- ``tiny_llama_dir`` / ``tiny_llama_draft_dir``: LlamaForCausalLM target (hidden 64) and draft (hidden 32).
- ``tiny_lfm2_dir`` / ``tiny_lfm2_draft_dir``: Lfm2ForCausalLM target and draft (conv + attention layers).
- ``make_tiny_checkpoint``: factory ``(name, arch="llama", hidden_size=32, num_layers=2, seed=0,
  vocab_size=None, tokenizer_path=None) -> Path`` for tests that need other shapes.
"""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest

TINY_VOCAB_SIZE = 384
SPECIAL_TOKENS = ["<pad>", "<bos>", "<eos>"]  # ids 0, 1, 2
TESTS_DIR = Path(__file__).parent
# The Hydra / W&B / notebook layer's tests, none of them marked ``cuda``, and the modules they import that the GPU
# machine (torch, safetensors and tokenizers only) lacks.
LAYER_TEST_DIRS = ("framework", "analysis", "cluster")
LAYER_MODULES = ("omegaconf", "hydra", "nbformat", "nbclient")


def pytest_ignore_collect(collection_path, config):
    """Under ``-m cuda`` without the Hydra layer installed, leave its test directories out instead of erroring.

    They hold no GPU test, so ``pytest -m cuda`` on a machine with only the engine's dependencies selects exactly
    what it would select with them. Returns None (no opinion) in every other case.
    """
    if config.getoption("markexpr") != "cuda" or collection_path.parent != TESTS_DIR:
        return None
    if collection_path.name not in LAYER_TEST_DIRS:
        return None
    if all(importlib.util.find_spec(name) is not None for name in LAYER_MODULES):
        return None
    return True


_CORPUS = """
Speculative decoding lets a small draft model propose several tokens that a large target model then
verifies in a single forward pass. When the draft agrees with the target, many tokens are emitted per
verification; when it disagrees, the target's own token replaces the first rejected draft token.
def add(a, b):
    return a + b
for i in range(10):
    print(i * i, add(i, 1))
The quick brown fox jumps over the lazy dog. A stitch in time saves nine. All that glitters is not gold.
class Cache:
    def __init__(self, num_blocks, block_size):
        self.num_blocks = num_blocks
        self.block_size = block_size
Acceptance length is one plus the accepted draft tokens divided by the number of drafts.
"""


def train_tiny_tokenizer(path: Path, vocab_size: int = TINY_VOCAB_SIZE) -> Path:
    """Train a byte-level BPE tokenizer on a fixed corpus and save it as ``path`` (a tokenizer.json).

    The result is deterministic; its vocabulary has exactly ``vocab_size`` entries (padded with unused
    ``<extra_i>`` tokens if the corpus yields fewer merges).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([_CORPUS] * 4, trainer=trainer)
    missing = vocab_size - tok.get_vocab_size()
    if missing > 0:
        tok.add_tokens([f"<extra_{i}>" for i in range(missing)])
    tok.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A <bos> $B", special_tokens=[("<bos>", 1)]
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(path))
    return path


def tiny_config(arch: str, hidden_size: int, num_layers: int, vocab_size: int):
    """A transformers config for a tiny model of ``arch`` ("llama" or "lfm2")."""
    from transformers import Lfm2Config, LlamaConfig

    common = {
        "vocab_size": vocab_size,
        "hidden_size": hidden_size,
        "intermediate_size": 2 * hidden_size,
        "num_hidden_layers": num_layers,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 2048,  # = engine=cpu's max_model_len: runs need no long-context override
        "pad_token_id": 0,
        "bos_token_id": 1,
        "eos_token_id": 2,
        # untied embeddings and a wide init keep tiny random models from just repeating their last token
        "tie_word_embeddings": False,
        "initializer_range": 0.2,
    }
    if arch == "llama":
        return LlamaConfig(**common)
    if arch == "lfm2":
        layer_types = ["conv" if i % 2 == 0 else "full_attention" for i in range(num_layers)]
        return Lfm2Config(
            **common,
            layer_types=layer_types,
            full_attn_idxs=[i for i, t in enumerate(layer_types) if t == "full_attention"],
            block_auto_adjust_ff_dim=False,
            block_ff_dim=2 * hidden_size,
            conv_L_cache=3,
        )
    raise ValueError(f"unknown tiny arch {arch!r}: choose llama or lfm2")


def build_tiny_checkpoint(
    out_dir: Path,
    tokenizer_path: Path,
    arch: str = "llama",
    hidden_size: int = 32,
    num_layers: int = 2,
    seed: int = 0,
    vocab_size: int | None = None,
) -> Path:
    """Write a random-weight HF checkpoint (config.json, model.safetensors, tokenizer.json) to ``out_dir``."""
    import torch
    from transformers import AutoModelForCausalLM

    config = tiny_config(arch, hidden_size, num_layers, vocab_size or TINY_VOCAB_SIZE)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    model.save_pretrained(out_dir)
    shutil.copy(tokenizer_path, out_dir / "tokenizer.json")
    return out_dir


@pytest.fixture(scope="session")
def tiny_tokenizer_path(tmp_path_factory) -> Path:
    return train_tiny_tokenizer(tmp_path_factory.mktemp("tokenizer") / "tokenizer.json")


@pytest.fixture(scope="session")
def make_tiny_checkpoint(tmp_path_factory, tiny_tokenizer_path):
    built: dict[tuple, Path] = {}

    def make(name: str, arch: str = "llama", hidden_size: int = 32, num_layers: int = 2, seed: int = 0,
             vocab_size: int | None = None, tokenizer_path: Path | None = None) -> Path:
        key = (name, arch, hidden_size, num_layers, seed, vocab_size, tokenizer_path)
        if key not in built:
            out = tmp_path_factory.mktemp(name)
            built[key] = build_tiny_checkpoint(
                out, tokenizer_path or tiny_tokenizer_path, arch, hidden_size, num_layers, seed, vocab_size
            )
        return built[key]

    return make


@pytest.fixture(scope="session")
def tiny_llama_dir(make_tiny_checkpoint) -> Path:
    return make_tiny_checkpoint("tiny-llama", "llama", hidden_size=64, num_layers=2, seed=0)


@pytest.fixture(scope="session")
def tiny_llama_draft_dir(make_tiny_checkpoint) -> Path:
    return make_tiny_checkpoint("tiny-llama-draft", "llama", hidden_size=32, num_layers=2, seed=1)


@pytest.fixture(scope="session")
def tiny_lfm2_dir(make_tiny_checkpoint) -> Path:
    return make_tiny_checkpoint("tiny-lfm2", "lfm2", hidden_size=64, num_layers=2, seed=0)


@pytest.fixture(scope="session")
def tiny_lfm2_draft_dir(make_tiny_checkpoint) -> Path:
    return make_tiny_checkpoint("tiny-lfm2-draft", "lfm2", hidden_size=32, num_layers=2, seed=1)


@pytest.fixture
def one_torch_thread():
    """torch on one intra-op thread for the test (CPU runs whose counts must not depend on the thread count),
    the previous setting restored after."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
