"""What ``python -m specexp list`` prints: every config group, each option with its description.

An option's description is the comment block at the top of its yaml file (``# @package`` lines skipped),
shown whole (wrapped to the terminal), so the yaml comment is the one place to describe an option. Pairs
also say whether their weights are trained or random (``weights:`` in the file): a random-weight pair's
acceptance is meaningless, it is there for memory and latency studies of real shapes.
"""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

# (group, what it chooses, how to choose an option), in the order a run is composed.
GROUPS = (
    ("pair", "the target and draft models", "pair=NAME"),
    ("speculator", "how drafts are proposed", "speculator=NAME"),
    ("short_conv", "short-conv (LFM2) layer options", "short_conv=NAME"),
    ("engine", "device, batch and CUDA-graph settings", "engine=NAME"),
    ("sampling", "greedy or sampled decoding", "sampling=NAME"),
    ("workload", "the prompts", "workload=NAME"),
    ("backend", "which engine serves the requests", "backend=NAME"),
    ("tracking", "Weights & Biases logging", "tracking=NAME"),
    ("exp", "experiments: recipes setting several groups, maybe a sweep", "+exp=NAME"),
    ("hydra/launcher", "where a sweep's jobs run; default: one after another here", "-m hydra/launcher=NAME"),
    ("zoo", "demo models the train command builds", "train +zoo=NAME"),
)
NAME_WIDTH = 18


def description(path: Path) -> str:
    """The leading comment block of a yaml file as one paragraph ('' when it has none)."""
    lines = []
    for line in path.read_text().splitlines():
        stripped = line.strip()
        if stripped.startswith("# @package"):
            continue
        if not stripped.startswith("#"):
            break
        lines.append(stripped.lstrip("#").strip())
    return " ".join(line for line in lines if line)


RANDOM_WEIGHTS_TAG = "[random weights: for memory and latency, acceptance is meaningless]"


def _weights_tag(path: Path) -> str:
    from omegaconf import OmegaConf

    return RANDOM_WEIGHTS_TAG + " " if OmegaConf.load(path).get("weights") == "random" else ""


def group_defaults(conf_dir: Path) -> dict[str, str]:
    """``{group: default option}`` from the root config's defaults list."""
    from omegaconf import OmegaConf

    defaults = {}
    for entry in OmegaConf.load(conf_dir / "config.yaml").get("defaults", []):
        if isinstance(entry, str) or len(entry) != 1:
            continue
        ((group, option),) = entry.items()
        defaults[str(group)] = str(option)
    return defaults


def render(conf_dir: Path, width: int | None = None) -> str:
    """The text of ``specexp list`` for the config directory ``conf_dir``, wrapped at ``width`` columns
    (default: the terminal's, at least 60)."""
    width = width or max(60, shutil.get_terminal_size((100, 24)).columns)
    defaults = group_defaults(conf_dir)
    indent = " " * (2 + NAME_WIDTH + 1)
    blocks = []
    for group, meaning, how in GROUPS:
        folder = conf_dir / group
        options = sorted(p.stem for p in folder.glob("*.yaml"))
        if not options:
            continue
        default = f"; default: {defaults[group]}" if group in defaults else ""
        lines = textwrap.wrap(f"{group}: {meaning} ({how}{default})", width=width, subsequent_indent="    ")
        for name in options:
            path = folder / f"{name}.yaml"
            text = (_weights_tag(path) if group == "pair" else "") + description(path)
            head = f"  {name:<{NAME_WIDTH}} "
            if len(head) > len(indent):  # a long name: its description starts on the next line
                lines.append(head.rstrip())
                head = indent
            wrapped = textwrap.wrap(text, width=width, initial_indent=head, subsequent_indent=indent,
                                    break_on_hyphens=False, break_long_words=False) or [head]
            lines.extend(line.rstrip() for line in wrapped)
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)
