"""Which keys a run config may hold and what each value may be: checked once, before any backend or model
loads, with one line naming the key or value and what would be valid.

A key is valid when :data:`SCHEMA` lists it for its group, or when the group's chosen option file
(``conf/<group>/<option>.yaml``) holds it, so a new key added to an option file needs no code here. Keys a
backend reads only for one option (``backend.gpu_memory_utilization`` for ``backend=vllm``) are listed in
:data:`OPTION_SCHEMA`. Free-form values (notes, labels, anything specexp does not read) go under ``extra.*``
(e.g. ``+extra.note=baseline``), which is recorded with the config and never checked; ``backend.llm_kwargs``
is vLLM's own free-form dict.

:func:`check_config` checks a resolved config (a plain dict) against this vocabulary: unknown keys (with the
closest valid names, by difflib), then every value listed in the schema (type, choices, range).
"""

from __future__ import annotations

import copy
import difflib
import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specexp.errors import ConfigError
from specexp.specs import CUDAGRAPH_MODES, DEVICES, DTYPES, WEIGHTS
from specexp.workloads.arrivals import ARRIVALS

WANDB_MODES = ("offline", "online", "disabled")
REJECTIONS = ("standard", "synthetic")
FREE_FORM_GROUP = "extra"


@dataclass(frozen=True)
class Key:
    """What one config value may be. ``kind``: ``int``, ``float``, ``bool``, ``str``, ``int_list``,
    ``float_list``, ``str_list`` or ``dict`` (free-form below it). ``minimum``/``maximum`` bound numbers (and
    each entry of a number list);
    ``words``: strings also accepted (``all``); ``note``: what special values mean, shown in messages."""

    kind: str
    nullable: bool = False
    choices: tuple = ()
    minimum: float | None = None
    maximum: float | None = None
    above_minimum: bool = False  # the minimum itself is not valid
    words: tuple = ()
    note: str = ""

    def describe(self) -> str:
        """What would be valid, as the end of an error line ("an integer >= 1 (0 = off)")."""
        if self.choices:
            text = "one of " + ", ".join(str(c) for c in self.choices)
        else:
            text = {"int": "an integer", "float": "a number", "bool": "true or false", "str": "a string",
                    "int_list": "a list of integers", "float_list": "a list of numbers",
                    "str_list": "a list of strings", "dict": "a mapping"}[self.kind]
            text += self._range()
        if self.words:
            text = " or ".join([*self.words, text])
        if self.nullable:
            text += " (or null)"
        return text + (f" ({self.note})" if self.note else "")

    def _range(self) -> str:
        low, high = self.minimum, self.maximum
        if low is not None and high is not None:
            return f" in {'(' if self.above_minimum else '['}{_num(low)}, {_num(high)}]"
        if low is not None:
            return f" {'>' if self.above_minimum else '>='} {_num(low)}"
        return f" <= {_num(high)}" if high is not None else ""

    def check(self, path: str, value: Any) -> None:
        """:class:`ConfigError` unless ``value`` is valid for the key at ``path``."""
        if value is None and self.nullable:
            return
        if isinstance(value, str) and value in self.words:
            return
        if not self._valid(value):
            raise ConfigError(f"{path}={value!r} is not valid: use {self.describe()}")

    def _valid(self, value: Any) -> bool:
        if self.choices:
            return value in self.choices
        if self.kind == "bool":
            return isinstance(value, bool)
        if self.kind == "str":
            return isinstance(value, str)
        if self.kind == "dict":
            return isinstance(value, dict)
        if self.kind == "str_list":
            return isinstance(value, list) and all(isinstance(v, str) for v in value)
        if self.kind == "int_list":
            return isinstance(value, list) and all(_is_int(v) and self._in_range(v) for v in value)
        if self.kind == "float_list":
            return isinstance(value, list) and all(_is_number(v) and self._in_range(v) for v in value)
        number = _is_int(value) if self.kind == "int" else _is_number(value)
        return number and self._in_range(value)

    def _in_range(self, value) -> bool:
        if self.minimum is not None and (value < self.minimum or (self.above_minimum and value == self.minimum)):
            return False
        return self.maximum is None or value <= self.maximum


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


class FreeForm:
    """Marks a subtree whose keys are never checked (``extra``, ``backend.llm_kwargs``); one instance,
    :data:`FREE`, which copies keep."""

    def __copy__(self):
        return self

    def __deepcopy__(self, memo):
        return self


FREE = FreeForm()
POSITIVE_INT = Key("int", minimum=1)
OPTIONAL_POSITIVE_INT = Key("int", nullable=True, minimum=1)

# group -> key -> Key (a leaf), a nested dict of the same shape, or FREE.
SCHEMA: dict[str, dict[str, Any]] = {
    "pair": {
        "name": Key("str"),
        "target": {"path": Key("str")},
        "draft": {"path": Key("str")},
        "weights": Key("str", choices=WEIGHTS),
        "dtype": Key("str", choices=DTYPES),
        "init_seed": Key("int", nullable=True),
    },
    "speculator": {
        "method": Key("str", choices=("draft_model",)),
        "num_speculative_tokens": Key("int", minimum=0, note="0 = no speculation"),
        "cudagraph_mode": Key("str", nullable=True, choices=CUDAGRAPH_MODES),
        "rejection": Key("str", choices=REJECTIONS),
        "synthetic_acceptance_rate": Key("float", minimum=0, maximum=1),
        # num_speculative_tokens_per_batch_size (a list of [start_bs, end_bs, k]) is checked by the engine
        "draft_confidence_threshold": Key("float", minimum=0, maximum=1, note="0 = off"),
        "adaptive": Key("str", choices=("off", "goodput")),
        "goodput_prior_acceptance": Key("float", minimum=0, maximum=1, note="adaptive goodput: in (0, 1)"),
        "goodput_ema_weight": Key("float", minimum=0, maximum=1, note="adaptive goodput: in (0, 1]"),
        "cudagraph_num_speculative_tokens": Key("int_list", nullable=True, minimum=0,
                                                note="null = every k the depth mode takes"),
        "synthetic_acceptance_rates": Key("float_list", nullable=True, minimum=0, maximum=1,
                                          note="one per draft position, non-increasing"),
        "synthetic_acceptance_length": Key("float", nullable=True, minimum=1, note="at most k + 1"),
        "draft_tensor_parallel_size": Key("int", nullable=True, minimum=1,
                                          note="vllm: 1 or engine.tensor_parallel_size; null = the target's"),
    },
    "short_conv": {"use_full_cuda_graph": Key("bool")},
    "engine": {
        "device": Key("str", choices=DEVICES),
        "max_num_seqs": POSITIVE_INT,
        "max_model_len": Key("int", minimum=2, words=("auto",),
                             note="auto = the longest prompt + max_new_tokens + k, rounded up to a block"),
        "allow_long_max_model_len": Key("bool", note="true: let requests run past max_position_embeddings"),
        "block_size": POSITIVE_INT,
        "num_kv_blocks": OPTIONAL_POSITIVE_INT,
        "max_num_batched_tokens": OPTIONAL_POSITIVE_INT,
        "cudagraph_mode": Key("str", choices=CUDAGRAPH_MODES),
        "seed": Key("int"),
        "cudagraph_capture_sizes": Key("int_list", nullable=True, minimum=1),
        "cudagraph_seq_len_buckets": Key("int_list", nullable=True, minimum=1),
        "cudagraph_prefill_tokens": Key("int_list", minimum=1),
        "cudagraph_mixed": Key("str", choices=("joined", "parts")),
        "cudagraph_shared_pool": Key("bool"),
        "compile_pointwise": Key("bool"),
        "linear_kernel": Key("str"),  # the choices are the engine's (checked with its other settings)
        "silu_in_down_gemv": Key("bool"),
        "silu_in_gate_up": Key("bool", words=("target", "draft"), note="target/draft: in that model only"),
        "fold_norm_weights": Key("bool"),
        "attention_kernel": Key("str"),
        "conv_kernel": Key("str"),
        "argmax_kernel": Key("str"),
        "sampler_kernel": Key("str"),
        "draft_step_kernel": Key("str"),
        "programmatic_launch": Key("bool", words=("auto",), note="auto: on where the GPU can, sm_90+"),
        "gemv_early_launch": Key("str", choices=("both", "target", "draft", "none")),
        "skinny_early_launch": Key("str", choices=("both", "target", "draft", "none")),
        "plain_decode_lookahead": Key("bool"),
        "steady_inputs_on_device": Key("bool"),
        "launch_graphs": Key("bool"),
        "draft_prefill_region": Key("str", choices=("auto", "full", "last_two")),
        "tensor_parallel_size": Key("int", minimum=1, note="GPUs the target is split over; > 1: backend vllm"),
    },
    "sampling": {
        "temperature": Key("float", minimum=0, note="0 = greedy"),
        "max_new_tokens": POSITIVE_INT,
        "ignore_eos": Key("bool"),
        "top_p": Key("float", minimum=0, maximum=1, above_minimum=True, note="1 = off"),
        "top_k": Key("int", minimum=0, note="0 = off"),
    },
    "workload": {
        "name": Key("str"),
        "path": Key("str", nullable=True),
        "num_prompts": Key("int", nullable=True, minimum=1, words=("all",), note="all or null = every prompt"),
        "input_len": OPTIONAL_POSITIVE_INT,
        "output_len": OPTIONAL_POSITIVE_INT,
        "seed": Key("int"),
        "arrival": Key("str", choices=ARRIVALS),
        "request_rate": Key("float", nullable=True, minimum=0, above_minimum=True, note="requests/s, poisson"),
        "max_concurrency": Key("int", nullable=True, minimum=1, note="requests in flight at most; null = no cap"),
        "arrival_path": Key("str", nullable=True),
    },
    "backend": {"name": Key("str")},  # the registered backends are checked by specexp.backends
    "tracking": {
        "wandb": {
            "mode": Key("str", choices=WANDB_MODES),
            "project": Key("str"),
            "entity": Key("str", nullable=True),
            "group": Key("str", nullable=True),
            "tags": Key("str_list"),
        },
    },
}
# (group, option) -> keys valid only when that option is chosen.
OPTION_SCHEMA: dict[tuple[str, str], dict[str, Any]] = {
    ("backend", "vllm"): {
        "gpu_memory_utilization": Key("float", minimum=0, maximum=1, above_minimum=True),
        "multiprocessing": Key("bool"),
        "llm_kwargs": FREE,
    },
}
TOP_LEVEL: dict[str, Any] = {
    "name": Key("str", note="a plain directory name: the run directory starts with it"),
    "slo": {
        "ttft_ms": Key("float", nullable=True, minimum=0, above_minimum=True, note="null = no objective"),
        "tpot_ms": Key("float", nullable=True, minimum=0, above_minimum=True, note="null = no objective"),
    },
    "isolate_sweep_jobs": Key("bool"),
    # sweep.devices takes an index, a list or "0,1": specexp.device_slots.parse_devices checks it
    "sweep": {"devices": None, "gpus_per_job": POSITIVE_INT, "reuse_engine": Key("bool")},
    "measure": {
        "repeats": POSITIVE_INT,
        "warmup_requests": Key("int", minimum=0, note="0 = no warm-up"),
        "warmup_new_tokens": Key("int", nullable=True, minimum=1, note="null = sampling.max_new_tokens"),
        "interleave": Key("bool"),
        "busy_load_per_core": Key("float", minimum=0),
        "max_relative_std": Key("float", minimum=0),
        "bootstrap_resamples": POSITIVE_INT,
        "bootstrap_seed": Key("int"),
    },
    FREE_FORM_GROUP: FREE,
}


# ------------------------------------------------------------------------------------------- vocabulary


def _yaml_keys(path: Path) -> dict[str, Any]:
    """The keys of one option file as a nested dict (leaves: None), without its ``defaults`` list."""
    if not path.is_file():
        return {}
    return _file_keys(str(path), path.stat().st_mtime_ns)


@functools.lru_cache(maxsize=256)
def _file_keys(path: str, mtime_ns: int) -> dict[str, Any]:
    import yaml

    node = yaml.safe_load(Path(path).read_text()) or {}
    return _shape({k: v for k, v in node.items() if k != "defaults"}) if isinstance(node, dict) else {}


def _shape(node: dict) -> dict[str, Any]:
    return {k: (_shape(v) if isinstance(v, dict) and v else None) for k, v in node.items()}


def _merge(schema: dict, yaml_keys: dict) -> dict:
    """Schema entries win; keys only the option file has are valid with an unchecked value (None)."""
    merged = dict(yaml_keys)
    for key, spec in schema.items():
        if isinstance(spec, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(spec, merged[key])
        else:
            merged[key] = spec
    return merged


def group_names(conf_dir: Path) -> list[str]:
    """Config groups that can appear in a run config (every ``conf/`` subdirectory but ``exp``, which
    is merged at the top level, and ``hydra``, Hydra's own groups such as ``hydra/launcher``)."""
    return sorted(p.name for p in conf_dir.iterdir()
                  if p.is_dir() and p.name not in ("exp", "hydra") and not p.name.startswith("."))


def group_vocabulary(conf_dir: Path, group: str, option: str | None) -> dict[str, Any]:
    """Valid keys of ``group`` when ``option`` is chosen (None: the union over every option of the group)."""
    options = [option] if option else sorted(p.stem for p in (conf_dir / group).glob("*.yaml"))
    in_files: dict[str, Any] = {}
    schema: dict[str, Any] = dict(SCHEMA.get(group, {}))
    for name in options:
        in_files = _merge(in_files, _yaml_keys(conf_dir / group / f"{name}.yaml"))
        schema = _merge(schema, OPTION_SCHEMA.get((group, name), {}))
    return _merge(schema, in_files)


def top_level_vocabulary(conf_dir: Path) -> dict[str, Any]:
    """Top-level keys of a run config other than the groups: the schema's and config.yaml's own."""
    return _merge(TOP_LEVEL, _yaml_keys(conf_dir / "config.yaml"))


def vocabulary(conf_dir: Path, choices: dict[str, str | None] | None = None) -> dict[str, Any]:
    """The valid keys of a whole run config whose groups chose ``choices`` (group -> option; a group missing
    from it accepts the keys of any of its options). A fresh copy: callers may change it."""
    key = tuple(sorted((k, v) for k, v in (choices or {}).items() if v is not None))
    return copy.deepcopy(_vocabulary(str(conf_dir), _tree_stamp(conf_dir), key))


def _tree_stamp(conf_dir: Path) -> tuple:
    """Changes whenever a config file is added, removed or edited (keeps the cache honest in tests)."""
    return tuple(sorted((str(p), p.stat().st_mtime_ns) for p in conf_dir.glob("**/*.yaml")))


@functools.lru_cache(maxsize=64)
def _vocabulary(conf_dir: str, stamp: tuple, choices: tuple) -> dict[str, Any]:
    root, chosen = Path(conf_dir), dict(choices)
    vocab = top_level_vocabulary(root)
    vocab.pop("hydra", None)
    for group in group_names(root):
        vocab[group] = group_vocabulary(root, group, chosen.get(group))
    return vocab


def closest(name: str, candidates, n: int = 3) -> list[str]:
    """Up to ``n`` of ``candidates`` closest to ``name`` (difflib), best first."""
    return difflib.get_close_matches(name, sorted(set(candidates)), n=n, cutoff=0.5)


def leaf_paths(vocab: dict, prefix: str = "") -> list[str]:
    """Every dotted key of a vocabulary (``pair.target.path``, ...)."""
    paths = []
    for key, spec in vocab.items():
        path = f"{prefix}{key}"
        paths.extend(leaf_paths(spec, f"{path}.") if isinstance(spec, dict) and spec else [path])
    return paths


def lookup(vocab: dict, path: str):
    """The vocabulary entry of dotted ``path``: a Key, a dict, FREE or None (valid, unchecked); raises
    KeyError naming the first unknown part."""
    node: Any = vocab
    for i, part in enumerate(path.split(".")):
        if node is FREE:
            return FREE
        if not isinstance(node, dict) or part not in node:
            raise KeyError(".".join(path.split(".")[: i + 1]))
        node = node[part]
    return node


def unknown_key_error(vocab: dict, path: str, conf_dir: Path | None = None,
                      choices: dict | None = None) -> ConfigError:
    """The one-line error for an unknown dotted key ``path`` (the first unknown part of it)."""
    parts = path.split(".")
    if len(parts) == 1 or parts[0] not in vocab:
        top = [k for k in vocab if k != FREE_FORM_GROUP]
        near = closest(parts[0], top)
        hint = f": did you mean {' or '.join(near)}?" if near else ""
        return ConfigError(
            f"unknown config group or key '{parts[0]}'{hint} (groups and keys: {', '.join(sorted(top))};"
            f" free-form values go under {FREE_FORM_GROUP}.*)"
        )
    parent_path, name = ".".join(parts[:-1]), parts[-1]
    parent = lookup(vocab, parent_path)
    siblings = sorted(parent) if isinstance(parent, dict) else []
    near = [f"{parent_path}.{n}" for n in closest(name, siblings)]
    hint = f": did you mean {' or '.join(near)}?" if near else ""
    group = parts[0]
    where = f"{parent_path}" + (f" with {group} '{choices[group]}'" if choices and choices.get(group) else "")
    elsewhere = _other_options_with(conf_dir, group, parts[1:], choices) if conf_dir else []
    other = f"; it is a key of {', '.join(f'{group}={o}' for o in elsewhere)}" if elsewhere else ""
    return ConfigError(
        f"unknown key {path}{hint} (keys of {where}: {', '.join(siblings)}{other};"
        f" free-form values go under {FREE_FORM_GROUP}.*)"
    )


def _other_options_with(conf_dir: Path, group: str, rest: list[str], choices: dict | None) -> list[str]:
    chosen = (choices or {}).get(group)
    if not chosen or not (conf_dir / group).is_dir():
        return []
    found = []
    for option in sorted(p.stem for p in (conf_dir / group).glob("*.yaml")):
        if option == chosen:
            continue
        try:
            lookup(group_vocabulary(conf_dir, group, option), ".".join(rest))
        except KeyError:
            continue
        found.append(option)
    return found


# ----------------------------------------------------------------------------------------------- checks


def check_keys(cfg: dict, vocab: dict, conf_dir: Path | None = None, choices: dict | None = None) -> None:
    """:class:`ConfigError` for the first key of ``cfg`` that ``vocab`` does not hold (below FREE and below
    keys only an option file names, nothing is checked)."""

    def walk(node: dict, spec: dict, parts: list[str]) -> None:
        for key, value in node.items():
            if key not in spec:
                raise unknown_key_error(vocab, ".".join([*parts, key]), conf_dir, choices)
            sub = spec[key]
            if isinstance(sub, dict) and sub and isinstance(value, dict):
                walk(value, sub, [*parts, key])

    walk(cfg, vocab, [])


def check_values(cfg: dict, vocab: dict, prefix: str = "") -> None:
    """:class:`ConfigError` for the first value of ``cfg`` its schema entry refuses (keys without one pass)."""
    for key, spec in vocab.items():
        if key not in cfg:
            continue
        path, value = f"{prefix}{key}", cfg[key]
        if isinstance(spec, Key):
            spec.check(path, value)
        elif isinstance(spec, dict) and spec:
            if not isinstance(value, dict):
                raise ConfigError(f"{path}={value!r} is not valid: use a mapping with keys {', '.join(sorted(spec))}")
            check_values(value, spec, f"{path}.")


def check_name(cfg: dict) -> None:
    """The experiment name starts the run directory's name: a plain name (no path separator)."""
    name = cfg.get("name")
    if isinstance(name, str) and (not name or "/" in name or name in (".", "..") or "\0" in name):
        raise ConfigError(f"name={name!r} is not valid: use a plain directory name (no '/'); the run directory"
                          " starts with it")


def check_config(cfg: dict, conf_dir: Path, choices: dict[str, str | None] | None = None) -> None:
    """Check every key and value of the resolved run config ``cfg`` (see the module docstring)."""
    vocab = vocabulary(conf_dir, choices)
    check_keys(cfg, vocab, conf_dir, choices)
    check_values(cfg, vocab)
    check_name(cfg)
