"""Choosing a workload's questions: ``workload.categories`` filters, ``workload.num_prompts`` samples
evenly across categories with ``workload.seed``.

Sampling: each category's questions are shuffled with ``random.Random(seed)``, the categories are put in a
seeded random order, and questions are taken one per category in turn until ``num_prompts`` are chosen (a
category that runs out is skipped), so counts per category differ by at most one unless a category is too
small. The chosen questions keep their file order. ``num_prompts`` null (or at least the number of
questions) takes them all.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import TypeVar

from specexp.errors import ConfigError

T = TypeVar("T")


def filter_categories(items: Sequence[T], categories: Sequence[str] | None, category_of, source: str) -> list[T]:
    """The items whose category is in ``categories`` (all when ``None`` or empty). :class:`ConfigError` naming
    the known categories when one of ``categories`` has no item."""
    if not categories:
        return list(items)
    if isinstance(categories, str):
        categories = [categories]
    known = list(dict.fromkeys(str(category_of(item)) for item in items))
    unknown = [c for c in categories if c not in known]
    if unknown:
        raise ConfigError(f"workload.categories: {', '.join(map(str, unknown))} not in {source}:"
                          f" choose from {', '.join(known)}")
    wanted = set(categories)
    return [item for item in items if str(category_of(item)) in wanted]


def sample_evenly(items: Sequence[T], num: int | None, seed: int | None, category_of) -> list[T]:
    """``num`` of ``items`` spread evenly over their categories (see the module docstring), in file order."""
    if num is None or num >= len(items):
        return list(items)
    if num < 0:
        raise ConfigError(f"workload.num_prompts={num} is not valid: use a count >= 0, or null for all")
    rng = random.Random(seed)
    groups: dict[str, list[int]] = {}
    for index, item in enumerate(items):
        groups.setdefault(str(category_of(item)), []).append(index)
    for indices in groups.values():
        rng.shuffle(indices)
    order = list(groups)
    rng.shuffle(order)
    chosen: list[int] = []
    depth = 0
    while len(chosen) < num:
        for category in order:
            if depth < len(groups[category]) and len(chosen) < num:
                chosen.append(groups[category][depth])
        depth += 1
    return [items[i] for i in sorted(chosen)]
