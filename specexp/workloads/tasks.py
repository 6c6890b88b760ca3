"""Spec-Bench's tasks: its 13 question categories grouped into the six tasks of its leaderboard."""

from __future__ import annotations

MT_BENCH_CATEGORIES = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")
SPEC_BENCH_TASKS: dict[str, tuple[str, ...]] = {
    "mt_bench": MT_BENCH_CATEGORIES,
    "translation": ("translation",),
    "summarization": ("summarization",),
    "qa": ("qa",),
    "math_reasoning": ("math_reasoning",),
    "rag": ("rag",),
}
TASK_OF_CATEGORY = {category: task for task, categories in SPEC_BENCH_TASKS.items() for category in categories}


def spec_bench_task(category: str | None) -> str | None:
    """The Spec-Bench task of ``category`` (``writing`` -> ``mt_bench``); a category outside Spec-Bench's
    13 is its own task; ``None`` stays ``None``."""
    if category is None:
        return None
    return TASK_OF_CATEGORY.get(category, category)
