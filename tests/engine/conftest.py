"""Fixtures the engine tests share."""

from __future__ import annotations

import pytest
from pairs import build_pairs


@pytest.fixture(scope="session")
def pair_dirs(tmp_path_factory):
    """The random tiny pairs of `pairs.build_pairs` (read-only checkpoints), built once per test run."""
    return build_pairs(tmp_path_factory.mktemp("pairs"))
