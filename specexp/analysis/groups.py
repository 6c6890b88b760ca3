"""Which runs belong together: comparison groups, their short labels and what each label means.

Two runs are *comparable* (one is the other's k=0 baseline, or both lie on the same depth curve) when they
are in the same sweep group and their resolved configs agree on everything that shapes the experiment —
pair, workload, backend, engine, sampling, short-conv and speculator settings — except the depth
``k``. Tracking settings and the experiment name do not count.

A group's *label* names only what tells it apart from the other groups of the frame (``tiny_lfm2 · code``,
``hf``, ``max_num_seqs=8``), at most :data:`MAX_LABEL_CHARS` characters; :func:`group_table` spells out
every differing key of each label (the legend table of ``report.md``).
"""

from __future__ import annotations

import json
import math
import re

import pandas as pd

from specexp.analysis.load import K_COLUMN

# Config groups (top-level keys of the resolved config) that define what a run measures.
EXPERIMENT_GROUPS = ("pair", "speculator", "short_conv", "engine", "sampling", "workload", "backend")
GROUP_KEY = "group_key"
GROUP_LABEL = "group"
MAX_LABEL_CHARS = 60
# Label parts in this order: what a reader looks for first. Other varying keys follow, the sweep last.
LABEL_PRIORITY = ("pair.name", "workload.name", "backend.name", "engine.device", "sampling.temperature",
                  "engine.max_num_seqs")
SEPARATOR = " · "
# Columns that say where and on what a group ran (the header of a group in report.md).
DESCRIPTION_COLUMNS = {"pair": "pair.name", "workload": "workload.name", "backend": "backend.name"}


def config_columns(df: pd.DataFrame) -> list[str]:
    """Flattened config columns that define the experiment (``pair.name``, ``workload.num_prompts``, ...)."""
    return [c for c in df.columns if c.split(".", 1)[0] in EXPERIMENT_GROUPS and "." in c]


def _missing(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _hashable(value) -> str:
    if _missing(value):
        value = None
    if hasattr(value, "tolist"):
        value = value.tolist()
    return json.dumps(value, sort_keys=True, default=str)


def comparison_columns(df: pd.DataFrame) -> list[str]:
    """Columns whose values must match for runs to be compared across k: the sweep group and every
    experiment-defining config column except k."""
    return ["sweep_group", *[c for c in config_columns(df) if c != K_COLUMN]]


def varying_columns(df: pd.DataFrame) -> list[str]:
    """Comparison columns whose value differs between runs of ``df``."""
    return [c for c in comparison_columns(df) if c in df and df[c].map(_hashable).nunique() > 1]


def _ordered(columns: list[str]) -> list[str]:
    """``columns`` in label order: :data:`LABEL_PRIORITY`, then the other ``X.name`` columns, then the rest
    (shallow keys before deep ones), ``sweep_group`` last."""
    def rank(column: str):
        if column == "sweep_group":
            return (3, 0, column)
        if column in LABEL_PRIORITY:
            return (0, LABEL_PRIORITY.index(column), column)
        if column.endswith(".name"):
            return (1, column.count("."), column)
        return (2, column.count("."), column)

    return sorted(columns, key=rank)


def label_columns(df: pd.DataFrame) -> list[str]:
    """The fewest varying columns, taken in label order, that tell every comparison group of ``df`` apart
    (a column joins only when it separates groups the earlier ones did not)."""
    keys = df[GROUP_KEY] if GROUP_KEY in df else _keys(df)
    firsts = df.loc[~keys.duplicated()]
    if len(firsts) < 2:
        return []
    chosen: list[str] = []
    distinct = 1
    for column in _ordered(varying_columns(df)):
        trial = firsts[[*chosen, column]].map(_hashable).astype(str).agg("|".join, axis=1).nunique()
        if trial > distinct:
            chosen.append(column)
            distinct = trial
        if distinct == len(firsts):
            break
    return chosen


def _short_names(columns: list[str]) -> dict[str, str]:
    """Each column's shortest dotted suffix that no other column of ``columns`` ends with."""
    names = {}
    for column in columns:
        parts = column.split(".")
        for n in range(1, len(parts) + 1):
            suffix = ".".join(parts[-n:])
            if not any(o != column and (o == suffix or o.endswith("." + suffix)) for o in columns):
                break
        names[column] = suffix
    return names


def _value(value) -> str:
    if _missing(value):
        return "none"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, (list, tuple)) or hasattr(value, "tolist"):
        return json.dumps(value.tolist() if hasattr(value, "tolist") else list(value), default=str)
    return str(value)


def _part(column: str, short: str, value) -> str:
    if column == "sweep_group":
        return _value(value) if not _missing(value) else "single runs"
    if column.endswith(".name"):
        return _value(value)
    return f"{short}={_value(value)}"


def _shorten(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1].rstrip(" ·") + "…"


def _keys(df: pd.DataFrame) -> pd.Series:
    columns = [c for c in comparison_columns(df) if c in df]
    return df[columns].apply(lambda row: "|".join(_hashable(v) for v in row), axis=1)


def describe_value(row, column: str) -> str:
    """``row[column]`` as a short string ("–" when absent)."""
    value = row.get(column) if hasattr(row, "get") else None
    return "–" if _missing(value) else _value(value)


def device_of(rows: pd.DataFrame) -> str:
    """Where ``rows`` ran: the GPU name(s) of ``env.gpu``, else ``env.device``, else ``engine.device``."""
    for column in ("env.gpu", "env.device", "engine.device"):
        if column in rows:
            values = [str(v) for v in dict.fromkeys(rows[column]) if not _missing(v)]
            if values:
                return ", ".join(values)
    return "unknown device"


def _sweep_names(values) -> dict:
    """Sweep group -> its label part: the experiment name (``depth_sweep`` of ``depth_sweep_20261201-210700``)
    when no other sweep shown shares it, else the whole name; "single runs" for runs of no sweep."""
    names = [v for v in dict.fromkeys(values) if not _missing(v)]
    short = {v: re.sub(r"_\d{8}-\d{6}$", "", str(v)) for v in names}
    counts = pd.Series(list(short.values())).value_counts()
    parts = {v: short[v] if counts[short[v]] == 1 else str(v) for v in names}
    return {**parts, None: "single runs"}


def _label_parts(firsts: pd.DataFrame, shown: list[str]) -> list[list[str]]:
    """Per group (rows of ``firsts``), the columns of ``shown`` its label needs: every ``X.name`` column
    shown, and another column only where it still separates the group from one not yet told apart."""
    values = firsts[shown].map(_hashable).to_numpy() if shown else None
    result = []
    for g in range(len(firsts)):
        others = [h for h in range(len(firsts)) if h != g]
        needed = []
        for i, column in enumerate(shown):
            differs = [h for h in others if values[h][i] != values[g][i]]
            if differs or column.endswith(".name"):
                needed.append(column)
            others = [h for h in others if values[h][i] == values[g][i]]
        result.append(needed)
    return result


def with_groups(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` plus ``group_key`` (identical for comparable runs) and ``group``: a label of at most
    :data:`MAX_LABEL_CHARS` characters, unique per group, made of the values that tell the groups apart
    (e.g. ``tiny_lfm2 · code``, ``random · native · input_len=8 · depth_sweep``; a single group is
    labelled by its pair, workload and backend). Labels that would be longer, or not unique, are numbered
    and cut (``G3 random · native · …``): :func:`group_table` says what each one means."""
    df = df.copy()
    if df.empty:
        df[GROUP_KEY] = pd.Series(dtype=object)
        df[GROUP_LABEL] = pd.Series(dtype=object)
        return df
    df[GROUP_KEY] = _keys(df)
    firsts = df.loc[~df[GROUP_KEY].duplicated()]
    shown = label_columns(df)
    parts = _label_parts(firsts, shown)
    if not shown:
        shown = [c for c in DESCRIPTION_COLUMNS.values() if c in df]
        parts = [shown] * len(firsts)
    short = _short_names(shown)
    sweeps = _sweep_names(firsts["sweep_group"]) if "sweep_group" in firsts else {}
    labels = {}
    for key, row, columns in zip(firsts[GROUP_KEY], firsts.to_dict("records"), parts):
        texts = [sweeps.get(None if _missing(row[c]) else row[c], "single runs") if c == "sweep_group"
                 else _part(c, short[c], row[c]) for c in columns]
        labels[key] = SEPARATOR.join(texts) or "runs"
    if len(set(labels.values())) < len(labels) or any(len(v) > MAX_LABEL_CHARS for v in labels.values()):
        labels = {key: _shorten(f"G{i + 1} {text}", MAX_LABEL_CHARS) for i, (key, text) in enumerate(labels.items())}
    df[GROUP_LABEL] = df[GROUP_KEY].map(labels)
    return df


def group_table(df: pd.DataFrame) -> pd.DataFrame:
    """One row per comparison group, in first-appearance order: ``group`` (the label), ``pair``,
    ``workload``, ``backend``, ``device``, ``sweep`` (sweep group or "single runs"), ``k`` (the depths, e.g.
    "0-8" or "2, 4"), ``runs``, ``ok`` (finished runs) and ``meaning``: every key that differs between the
    groups of ``df``, as ``key=value`` (the legend of the labels)."""
    columns = [GROUP_LABEL, *DESCRIPTION_COLUMNS, "device", "sweep", "k", "runs", "ok", "meaning", GROUP_KEY]
    if df.empty:
        return pd.DataFrame(columns=columns)
    df = df if GROUP_KEY in df else with_groups(df)
    varying = [c for c in _ordered(varying_columns(df)) if not _implied_by_name(df, c)]
    rows = []
    for key, group in df.groupby(GROUP_KEY, sort=False):
        first = group.iloc[0]
        ks = sorted({int(k) for k in group["k"] if not _missing(k)}) if "k" in group else []
        meaning = ", ".join(f"sweep={describe_value(first, c) if not _missing(first.get(c)) else 'single runs'}"
                            if c == "sweep_group" else f"{c}={describe_value(first, c)}" for c in varying)
        rows.append({
            GROUP_LABEL: first[GROUP_LABEL],
            **{name: describe_value(first, column) for name, column in DESCRIPTION_COLUMNS.items()},
            "device": device_of(group),
            "sweep": describe_value(first, "sweep_group") if not _missing(first.get("sweep_group")) else "single runs",
            "k": _ranges(ks), "runs": len(group),
            "ok": int((group["status"] == "ok").sum()) if "status" in group else len(group),
            "meaning": meaning or "(one group)", GROUP_KEY: key,
        })
    return pd.DataFrame(rows, columns=columns)


def _implied_by_name(df: pd.DataFrame, column: str) -> bool:
    """Whether ``column`` (``pair.target.path``) is fixed by its group's varying ``X.name`` (``pair.name``):
    one value per name, so saying the name says it."""
    prefix = column.split(".", 1)[0]
    name = f"{prefix}.name"
    if column == name or name not in df or column == "sweep_group":
        return False
    return bool((df[[name, column]].map(_hashable).groupby(name)[column].nunique() <= 1).all())


def _ranges(values: list[int]) -> str:
    """[0, 1, 2, 4] -> "0-2, 4"."""
    out, start = [], None
    for i, v in enumerate(values):
        if start is None:
            start = v
        if i + 1 == len(values) or values[i + 1] != v + 1:
            out.append(str(start) if start == v else f"{start}-{v}")
            start = None
    return ", ".join(out) or "–"
