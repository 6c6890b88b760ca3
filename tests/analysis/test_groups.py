"""Comparison groups and their labels: unique, at most 60 characters, naming only what tells a group apart,
with a legend table that spells out every differing key."""

from __future__ import annotations

import pandas as pd
from analysis_records import synthetic_record
from hypothesis import given, settings
from hypothesis import strategies as st

from specexp.analysis.groups import MAX_LABEL_CHARS, group_table, with_groups
from specexp.analysis.load import record_row, runs_frame


def _frame(records: list[dict]) -> pd.DataFrame:
    return runs_frame([record_row(r, f"/runs/{i}") for i, r in enumerate(records)])


def _record(k=2, *, pair="tiny_lfm2", workload="code", backend="native", group="depth_sweep_20261201-100000",
            **config) -> dict:
    record = synthetic_record(k, pair=pair, workload=workload, backend=backend, group=group)
    for key, value in config.items():
        section, name = key.split("__")
        record["config"][section][name] = value
    return record


def test_labels_name_only_what_differs():
    df = with_groups(_frame([_record(k, pair=p, workload=w) for p in ("a", "b") for w in ("code", "prose")
                             for k in (0, 2)]))
    assert list(dict.fromkeys(df["group"])) == ["a · code", "a · prose", "b · code", "b · prose"]


def test_one_group_is_labelled_by_its_pair_workload_and_backend():
    df = with_groups(_frame([_record(k) for k in (0, 1, 2)]))
    assert set(df["group"]) == {"tiny_lfm2 · code · native"}


def test_a_key_below_a_name_joins_the_label_only_where_it_separates_groups():
    records = [_record(2, workload="code", group=None), _record(2, workload="random", group=None, workload__input_len=8),
               _record(2, workload="random", group=None, workload__input_len=16)]
    df = with_groups(_frame(records))
    assert list(df.drop_duplicates("group_key")["group"]) == ["code", "random · input_len=8", "random · input_len=16"]


def test_sweeps_are_named_by_their_experiment_when_that_is_unique():
    records = [_record(k, group="depth_sweep_20261201-100000") for k in (0, 1)] + [_record(1, group=None)]
    df = with_groups(_frame(records))
    assert set(df["group"]) == {"depth_sweep", "single runs"}
    records += [_record(1, group="depth_sweep_20261202-100000")]
    labels = set(with_groups(_frame(records))["group"])
    assert labels == {"depth_sweep_20261201-100000", "depth_sweep_20261202-100000", "single runs"}


def test_legend_table_names_pair_workload_backend_device_and_every_differing_key():
    records = [_record(k, pair=p, backend=b) for p in ("a", "b") for b in ("native", "hf") for k in (0, 4)]
    table = group_table(with_groups(_frame(records)))
    assert list(table.columns[:5]) == ["group", "pair", "workload", "backend", "device"]
    row = table.set_index("group").loc["a · hf"]
    assert (row["pair"], row["workload"], row["backend"], row["device"], row["k"]) == ("a", "code", "hf", "cpu", "0, 4")
    assert row["meaning"] == "pair.name=a, backend.name=hf"  # pair.target.path follows from pair.name


config_values = st.fixed_dictionaries({
    "pair": st.sampled_from(["tiny_lfm2", "tiny_llama", "lfm2_1b_random_with_a_long_name"]),
    "workload": st.sampled_from(["code", "prose", "random"]),
    "backend": st.sampled_from(["native", "hf"]),
    "engine__max_num_seqs": st.sampled_from([1, 8, 64]),
    "sampling__temperature": st.sampled_from([0.0, 0.7]),
    "workload__input_len": st.sampled_from([32, 128, 4096]),
    "group": st.sampled_from([None, "depth_sweep_20261201-100000", "a_very_long_experiment_name_20261201-100000"]),
})


@settings(max_examples=60, deadline=None)
@given(st.lists(config_values, min_size=1, max_size=12))
def test_labels_are_unique_per_group_and_at_most_60_characters(configs):
    df = with_groups(_frame([_record(2, **c) for c in configs]))
    labels = df.drop_duplicates("group_key")["group"]
    assert labels.is_unique
    assert labels.map(len).max() <= MAX_LABEL_CHARS
    assert df.groupby("group_key")["group"].nunique().eq(1).all()
    table = group_table(df)
    assert len(table) == df["group_key"].nunique() and table["meaning"].map(bool).all()
