"""`specexp list` through the CLI: every config group, each option's whole description, random pairs marked."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from specexp.catalog import GROUPS, RANDOM_WEIGHTS_TAG, description
from specexp.cli import conf_dir


@pytest.fixture(scope="module")
def listing() -> str:
    proc = subprocess.run([sys.executable, "-m", "specexp", "list"], capture_output=True, text=True, check=True,
                          env={**os.environ, "COLUMNS": "100"}, timeout=120)
    return proc.stdout


def test_every_config_group_is_listed(listing):
    headers = [line.split(":")[0] for line in listing.splitlines() if line and not line.startswith(" ")]
    assert headers == ["pair", "speculator", "short_conv", "engine", "sampling", "workload", "backend", "tracking",
                       "exp", "hydra/launcher", "zoo"]
    assert [g for g, _, _ in GROUPS] == headers


def test_each_description_is_shown_whole(listing):
    text = " ".join(listing.split())
    for group, _, _ in GROUPS:
        for path in sorted((conf_dir() / group).glob("*.yaml")):
            words = description(path).split()
            assert words, f"{path} has no description comment"
            assert " ".join(words) in text, path


def option_texts(listing: str, group: str) -> dict[str, str]:
    """``{option: its listed text}`` of one group's block."""
    block = listing.split("\n\n")[[g for g, _, _ in GROUPS].index(group)].splitlines()[1:]
    texts: dict[str, str] = {}
    for line in block:
        if not line.startswith("   "):  # "  name  text": a new option
            name, _, line = line.strip().partition(" ")
            texts[name] = ""
        texts[name] += " " + line.strip()
    return {name: " ".join(text.split()) for name, text in texts.items()}


def test_random_weight_pairs_say_so(listing):
    texts = option_texts(listing, "pair")
    assert sorted(texts) == sorted(p.stem for p in (conf_dir() / "pair").glob("*.yaml"))
    for name, text in texts.items():
        random = "weights: random" in (conf_dir() / "pair" / f"{name}.yaml").read_text()
        assert text.startswith(RANDOM_WEIGHTS_TAG) == random, name
    assert not texts["tiny_lfm2"].startswith(RANDOM_WEIGHTS_TAG)


def test_no_line_passes_the_terminal_width(listing):
    assert max(len(line) for line in listing.splitlines()) <= 100
