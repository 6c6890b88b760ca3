"""Command-line overrides of a run, checked before Hydra sees them, and the jobs a sweep expands to.

Hydra alone gives seven lines for a typo'd key and none of the valid names, and accepts an appended typo
(``+speculator.num_speculatve_tokens=2``) silently. Here every override is checked against the config's
vocabulary (:mod:`specexp.config_schema`) first: a group must exist and name one of its options, a key must
be valid for the options chosen. A valid key the option file leaves out needs no ``+``
(``engine.num_kv_blocks=64`` is rewritten to Hydra's add-or-override ``++``), and ``+`` on a key that exists
just sets it. ``sweep.devices=0,1`` names two GPUs, not a sweep over them (:func:`device_list`).
:func:`sweep_jobs` expands a sweep into its jobs exactly as Hydra's basic sweeper numbers them.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

from specexp import config_schema
from specexp.errors import ConfigError

_MISSING = object()


@dataclass(frozen=True)
class ParsedOverride:
    """One override: ``text`` as typed, its ``key`` (``speculator.num_speculative_tokens``, ``pair``), ``kind``
    (``group`` = a group's option, ``key`` = a value, ``hydra`` = Hydra's own settings) and Hydra's parse."""

    text: str
    key: str
    kind: str
    hydra: object

    @property
    def is_delete(self) -> bool:
        from hydra.core.override_parser.types import OverrideType

        return self.hydra.type == OverrideType.DEL

    def value_text(self) -> str:
        return self.text.split("=", 1)[1] if "=" in self.text else ""


def _parser():
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return OverridesParser.create()


def parse(overrides: list[str], conf_dir: Path) -> list[ParsedOverride]:
    """Parse ``overrides`` with Hydra's grammar and classify each; :class:`ConfigError` for one it cannot read."""
    from hydra.errors import HydraException

    groups = {*config_schema.group_names(conf_dir), "exp"}
    parsed = []
    for text in overrides:
        try:
            (override,) = _parser().parse_overrides([text])
        except HydraException as e:
            reason = str(e).splitlines()[0]
            raise ConfigError(f"cannot read the override {text!r} ({reason}): write key=value,"
                              " e.g. sampling.temperature=0.5") from None
        key = override.key_or_group
        if key == "hydra" or key.startswith(("hydra.", "hydra/")):
            kind = "hydra"
        elif "." not in key and ("/" not in key and key in groups
                                 or "/" in key and key.split("/")[0] in groups and (conf_dir / key).is_dir()):
            kind = "group"  # a group, or a group nested in one (speculator/depth)
        else:
            kind = "key"
        parsed.append(ParsedOverride(text, key, kind, override))
    return parsed


def check_groups(parsed: list[ParsedOverride], conf_dir: Path) -> None:
    """Every ``group=OPTION`` names an existing option (sweep lists element by element)."""
    from specexp.cli import GROUP_LABELS

    for override in parsed:
        if override.kind != "group" or override.is_delete:
            continue
        valid = sorted(p.stem for p in (conf_dir / override.key).glob("*.yaml"))
        for name in _values(override):
            if name not in valid:
                near = config_schema.closest(name, valid)
                hint = f" (did you mean {' or '.join(near)}?)" if near else ""
                label = GROUP_LABELS.get(override.key, override.key)
                raise ConfigError(f"unknown {label} '{name}': choose one of {', '.join(valid)}{hint}")


def _values(override: ParsedOverride) -> list[str]:
    """The option names a group override asks for (every element of a sweep)."""
    o = override.hydra
    if o.is_sweep_override():
        return [str(v) for v in o.sweep_string_iterator()]
    value = o.value()
    return [str(value)] if value is not None else []


def check_top_level(parsed: list[ParsedOverride], conf_dir: Path) -> None:
    """The first part of every key names a config group or a top-level key."""
    vocab = config_schema.vocabulary(conf_dir)
    for override in parsed:
        if override.kind == "key" and override.key.split(".")[0] not in vocab:
            raise config_schema.unknown_key_error(vocab, override.key.split(".")[0], conf_dir)


@functools.lru_cache(maxsize=64)
def _compose(conf_dir: str, overrides: tuple[str, ...]):
    """Hydra's composed config (with its ``hydra`` node) for ``overrides``."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException

    try:
        with initialize_config_dir(config_dir=conf_dir, version_base="1.3"):
            return compose(config_name="config", overrides=list(overrides), return_hydra_config=True)
    except HydraException as e:
        raise ConfigError(_hydra_error_line(e)) from None


def _hydra_error_line(e: Exception) -> str:
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    return " ".join(lines[:2]) if lines else type(e).__name__


def compose(conf_dir: Path, overrides: list[str]):
    """The composed config of ``overrides`` (cached; do not modify it)."""
    return _compose(str(conf_dir), tuple(overrides))


def compose_job(conf_dir: Path, overrides: list[str]):
    """The composed config of one job, as Hydra composes it, but fast for the many jobs of a sweep: the
    options its group overrides choose are composed once (cached), then its value overrides are applied to a
    copy with Hydra's own function."""
    import copy

    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra.errors import HydraException

    parsed = parse(overrides, conf_dir)
    chooses = [o for o in parsed if o.kind == "group" or "/" in o.key]
    cfg = copy.deepcopy(compose(conf_dir, [o.text for o in chooses]))
    try:
        ConfigLoaderImpl._apply_overrides_to_config([o.hydra for o in parsed if o not in chooses], cfg)
    except HydraException as e:
        raise ConfigError(_hydra_error_line(e)) from None
    return cfg


def choices_of(cfg) -> dict[str, str | None]:
    """group -> chosen option of a composed config (Hydra's ``hydra.runtime.choices``, groups only)."""
    return {k: v for k, v in dict(cfg.hydra.runtime.choices).items() if not k.startswith("hydra")}


def sweeper_params(cfg) -> list[str]:
    """The sweep a composed config declares (``hydra.sweeper.params``) as overrides, as Hydra's basic
    sweeper reads them."""
    from omegaconf import OmegaConf

    params = OmegaConf.select(cfg, "hydra.sweeper.params") or {}
    return [f"{k}={v}" for k, v in params.items()]


def sweep_jobs(overrides: list[str], declared: list[str]) -> list[list[str]]:
    """The override list of every job of a sweep, in Hydra's order (job ``i`` runs in ``SWEEP_DIR/i``).
    ``declared``: the experiment's own ``hydra.sweeper.params`` (command-line overrides win)."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper

    (batch,) = BasicSweeper.split_arguments(_parser().parse_overrides([*declared, *overrides]), None) or [[[]]]
    return [list(job) for job in batch]


def _present(cfg, key: str) -> bool:
    """Whether the composed config holds ``key`` (a mandatory ``???`` value counts)."""
    from omegaconf import DictConfig, OmegaConf

    parent, _, name = key.rpartition(".")
    node = OmegaConf.select(cfg, parent, default=_MISSING) if parent else cfg
    return isinstance(node, DictConfig) and name in node.keys()  # noqa: SIM118 - `in node` is False for ???


DEVICE_LIST_KEY = "sweep.devices"


def device_list(override: str) -> str:
    """``sweep.devices=0,1`` as Hydra's list ``sweep.devices=[0,1]`` (a comma there lists GPUs; it never sweeps
    over them); every other override as it is."""
    key, eq, value = override.partition("=")
    text = value.strip()
    if eq and key.lstrip("+~") == DEVICE_LIST_KEY and "," in text and not text.startswith(("[", "'", '"')):
        return f"{key}=[{text}]"
    return override


def normalize(overrides: list[str], conf_dir: Path, multirun: bool) -> list[str]:
    """Check ``overrides`` (groups, then keys against the vocabulary of every combination of options they
    choose) and return them as Hydra should get them: a valid key the composed config lacks gets ``++``, a
    ``+`` on a key it has is dropped, ``sweep.devices=0,1`` becomes a list (:func:`device_list`).
    :class:`ConfigError` (one line) for the first bad one."""
    parsed = parse([device_list(o) for o in overrides], conf_dir)
    check_groups(parsed, conf_dir)
    check_top_level(parsed, conf_dir)
    group_texts = [o.text for o in parsed if o.kind == "group"]
    bases = [compose(conf_dir, [o.text for o in parsed if o.kind == "group" and not o.hydra.is_sweep_override()])]
    if multirun:
        declared = [p for p in sweeper_params(bases[0]) if "." not in p.split("=")[0]]  # swept groups
        bases = [compose(conf_dir, combo) for combo in sweep_jobs(group_texts, declared)]
    normalized = []
    for override in parsed:
        if override.kind != "key" or override.is_delete:
            normalized.append(override.text)
            continue
        for base in bases:
            choices = choices_of(base)
            vocab = config_schema.vocabulary(conf_dir, choices)
            try:
                config_schema.lookup(vocab, override.key)
            except KeyError:
                raise config_schema.unknown_key_error(vocab, override.key, conf_dir, choices) from None
        value = override.value_text()
        if all(_present(base, override.key) for base in bases):
            normalized.append(f"{override.key}={value}")
        else:
            normalized.append(f"++{override.key}={value}")
    return normalized
