"""Which runs belong together: comparison groups and their labels.

Two runs are *comparable* (one is the other's k=0 baseline, or both lie on the same depth curve) when they
are in the same sweep group and their resolved configs agree on everything that shapes the experiment —
pair, workload, backend, engine, sampling, short-conv and speculator settings — except the depth
``k``. Tracking settings and the experiment name do not count.
"""

from __future__ import annotations

import json
import math

import pandas as pd

from specexp.analysis.load import K_COLUMN

# Config groups (top-level keys of the resolved config) that define what a run measures.
EXPERIMENT_GROUPS = ("pair", "speculator", "short_conv", "engine", "sampling", "workload", "backend")
GROUP_KEY = "group_key"
GROUP_LABEL = "group"


def config_columns(df: pd.DataFrame) -> list[str]:
    """Flattened config columns that define the experiment (``pair.name``, ``workload.num_prompts``, ...)."""
    return [c for c in df.columns if c.split(".", 1)[0] in EXPERIMENT_GROUPS and "." in c]


def _hashable(value) -> str:
    if isinstance(value, float) and math.isnan(value):
        value = None
    return json.dumps(value, sort_keys=True, default=str)


def comparison_columns(df: pd.DataFrame) -> list[str]:
    """Columns whose values must match for runs to be compared across k: the sweep group and every
    experiment-defining config column except k."""
    return ["sweep_group", *[c for c in config_columns(df) if c != K_COLUMN]]


def varying_columns(df: pd.DataFrame) -> list[str]:
    """Comparison columns whose value differs between runs of ``df``."""
    return [c for c in comparison_columns(df) if c in df and df[c].map(_hashable).nunique() > 1]


def label_columns(df: pd.DataFrame) -> list[str]:
    """The varying columns worth showing in a label: a group's ``X.name`` stands for all its ``X.*``
    columns (``pair.name`` rather than ``pair.target.path``)."""
    varying = varying_columns(df)
    named = {c.split(".", 1)[0] for c in varying if c.endswith(".name") and c.count(".") == 1}
    return [c for c in varying if c.split(".", 1)[0] not in named or c == f"{c.split('.', 1)[0]}.name"]


def with_groups(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` plus ``group_key`` (identical for comparable runs) and ``group`` (a short readable label made
    of the values that differ between groups, e.g. ``tiny_lfm2 · code``; the sweep name if only one
    group)."""
    df = df.copy()
    if df.empty:
        df[GROUP_KEY] = pd.Series(dtype=object)
        df[GROUP_LABEL] = pd.Series(dtype=object)
        return df
    columns = [c for c in comparison_columns(df) if c in df]
    df[GROUP_KEY] = df[columns].apply(lambda row: "|".join(_hashable(v) for v in row), axis=1)
    shown = label_columns(df)

    def label(row) -> str:
        parts = []
        for column in shown:
            value = row[column]
            parts.append(str(value) if column.endswith(".name") else f"{column.rsplit('.', 1)[-1]}={value}")
        if parts:
            return " · ".join(parts)
        return str(row["sweep_group"]) if isinstance(row["sweep_group"], str) else "runs"

    df[GROUP_LABEL] = df.apply(label, axis=1)
    return df
