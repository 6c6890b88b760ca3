"""Fixtures of the model tests: one tiny HF checkpoint per case (built once per test run) + its tokenizer."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # harness.py, checkpoints.py

from checkpoints import CASES, build_checkpoint, train_tokenizer


@dataclass
class Case:
    id: str
    path: Path
    hf_model: object  # the transformers model the checkpoint was saved from (fp32, eval)


@pytest.fixture(scope="session")
def tokenizer_path(tmp_path_factory) -> Path:
    return train_tokenizer(tmp_path_factory.mktemp("tokenizer") / "tokenizer.json")


@pytest.fixture(scope="session")
def case_cache(tmp_path_factory, tokenizer_path):
    built: dict[str, Case] = {}

    def get(case_id: str) -> Case:
        if case_id not in built:
            family, overrides = CASES[case_id]
            path = tmp_path_factory.mktemp(case_id)
            built[case_id] = Case(case_id, path, build_checkpoint(path, family, overrides, tokenizer_path))
        return built[case_id]

    return get


@pytest.fixture(params=sorted(CASES))
def case(request, case_cache) -> Case:
    return case_cache(request.param)
