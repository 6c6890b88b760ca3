"""specexp: a research framework for speculative decoding (draft/target pairs, depth sweeps, CUDA-graph cost)."""

__version__ = "0.1.0"
