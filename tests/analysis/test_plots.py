"""Every figure returns a matplotlib Figure, with or without data to plot, and stays readable on the sweeps
users make: one captured size, seven captured sizes, several pairs (legends of at most ten entries, no
empty axes, labelled axes, titles naming the pair and the device), and on any mix of runs."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd
import pytest
from analysis_records import FIGURE_SWEEPS, figure_sweep, synthetic_record, synthetic_steps
from matplotlib.figure import Figure

from specexp.analysis import load_runs, plots
from specexp.analysis.graph_plots import manager_family

MAX_LEGEND_ENTRIES = 10


def _texts(fig: Figure) -> str:
    return " ".join(t.get_text() for ax in fig.axes for t in ax.texts)


def _plot_axes(fig: Figure) -> list:
    """The axes that plot data (colour bars left out)."""
    return [ax for ax in fig.axes if getattr(ax, "_colorbar", None) is None]


def _legend_sizes(fig: Figure) -> list[int]:
    legends = [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None] + list(fig.legends)
    return [len(legend.get_texts()) for legend in legends]


def _has_data(ax) -> bool:
    return bool(ax.lines or ax.patches or ax.collections or ax.images)


@pytest.fixture(scope="module")
def figure_sweeps(tmp_path_factory) -> dict[str, pd.DataFrame]:
    """name -> loaded runs of each sweep of FIGURE_SWEEPS (written as run records, GPU-shaped)."""
    import json

    root = tmp_path_factory.mktemp("figure-sweeps")
    for name in FIGURE_SWEEPS:
        for subdir, record, steps in figure_sweep(name):
            run_dir = root / subdir
            run_dir.mkdir(parents=True)
            (run_dir / "result.json").write_text(json.dumps({**record, "run_dir": str(run_dir)}))
            steps.to_parquet(run_dir / "steps.parquet", index=False)
    return {name: load_runs(root / name) for name in FIGURE_SWEEPS}


@pytest.mark.parametrize("sweep", sorted(FIGURE_SWEEPS))
@pytest.mark.parametrize("name", sorted(plots.FIGURES))
def test_figure_is_readable_on_one_size_seven_size_and_multi_pair_sweeps(figure_sweeps, sweep, name):
    runs = figure_sweeps[sweep]
    fig = plots.FIGURES[name](runs)
    axes = _plot_axes(fig)
    assert axes, "no axes"
    for ax in axes:
        assert _has_data(ax), f"empty axes {ax.get_title()!r}"
        assert ax.get_xlabel() and (ax.get_ylabel() or ax.get_yticklabels()), f"unlabelled axes {ax.get_title()!r}"
    assert all(n <= MAX_LEGEND_ENTRIES for n in _legend_sizes(fig)), _legend_sizes(fig)
    heading = fig._suptitle.get_text()
    assert "NVIDIA H200" in heading
    pairs = runs["pair.name"].unique()
    assert (pairs[0] in heading) if len(pairs) == 1 else f"{len(pairs)} pairs" in heading
    if len(pairs) > 1:  # each pair is named where its curve or panel is
        shown = " ".join([ax.get_title() for ax in axes] + [t.get_text() for ax in axes if ax.get_legend()
                                                              for t in ax.get_legend().get_texts()])
        assert all(pair in shown for pair in pairs)
    assert "no " not in _texts(fig)
    plt.close(fig)


@pytest.mark.parametrize("sweep", sorted(FIGURE_SWEEPS))
def test_graph_memory_stacks_managers_with_a_short_legend_and_linear_axes(figure_sweeps, sweep):
    runs = figure_sweeps[sweep]
    fig = plots.graph_memory(runs)
    managers = {e["manager"] for cell in runs["graph_capture_per_size"] for e in cell}
    assert len(managers) > MAX_LEGEND_ENTRIES  # the record has more managers than a legend may list
    (legend,) = fig.legends
    names = [t.get_text() for t in legend.get_texts()]
    assert len(names) <= MAX_LEGEND_ENTRIES
    assert {manager_family(m) for m in managers} <= set(names)
    assert all(ax.get_xscale() == "linear" and ax.get_yscale() == "linear" for ax in fig.axes)
    grids = [ax for ax in _plot_axes(fig) if ax.images]
    assert len(grids) == runs["pair.name"].nunique()
    sizes = {s for cell in runs["graph_capture_per_size"] for s in (e["num_reqs"] for e in cell)}
    assert all(len(ax.get_xticks()) == len(sizes) for ax in grids)  # one column per captured size
    plt.close(fig)


def test_graph_memory_bars_add_up_to_each_run_total(figure_sweeps):
    runs = figure_sweeps["one_size"]
    fig = plots.graph_memory(runs)
    memory_axes = next(ax for ax in fig.axes if ax.get_title() == "memory by manager")
    tops = {}
    for bar in memory_axes.patches:
        x = round(bar.get_x() + bar.get_width() / 2)
        tops[x] = max(tops.get(x, 0.0), bar.get_y() + bar.get_height())
    expected = runs.set_index("k")["graph_capture_bytes"] / 2**20
    assert tops == pytest.approx(expected.to_dict())
    plt.close(fig)


def test_manager_families_merge_the_prompt_graphs_of_each_token_count():
    assert manager_family("target_prefill_128") == "target_prefill_*"
    assert manager_family("draft_prompt_prefill_17") == "draft_prompt_prefill_*"
    assert manager_family("target_verify") == "target_verify"


@pytest.fixture
def sweep(write_run, tmp_path) -> pd.DataFrame:
    for pair in ("a", "b"):
        for k in (0, 1, 2, 4):
            write_run(f"s/{pair}{k}", synthetic_record(k, pair=pair, tokens_per_s=50.0 + 10 * k), synthetic_steps(k))
    return load_runs(tmp_path / "runs")


@pytest.mark.parametrize("name", sorted(plots.FIGURES))
def test_figure_draws_every_group(sweep, name):
    fig = plots.FIGURES[name](sweep)
    assert isinstance(fig, Figure)
    if name != "graph_memory":
        assert all(_has_data(ax) for ax in _plot_axes(fig))
    plt.close(fig)


@pytest.mark.parametrize("name", sorted(plots.FIGURES))
def test_figure_of_no_runs_says_so(name):
    fig = plots.FIGURES[name](load_runs([]))
    assert "no" in _texts(fig)
    plt.close(fig)


def test_graph_memory_on_cpu_runs_says_no_gpu_graph_data(sweep):
    fig = plots.graph_memory(sweep)
    assert "no GPU graph data" in _texts(fig)
    plt.close(fig)


def _mixed_runs(write_run, tmp_path) -> pd.DataFrame:
    """A sweep, two single runs whose configs differ only below a name (workload.input_len) and a backend
    comparison at one k — the mix that once broke per_position_curves (labels shared by two groups)."""
    for k in (0, 1, 2):
        write_run(f"sweep/{k}", synthetic_record(k, workload="random", group="depth_sweep_20261201-100000"))
    for name, input_len in (("single_a", 8), ("single_b", 16)):
        record = synthetic_record(2, workload="random", group=None)
        record["config"]["workload"]["input_len"] = input_len
        record["wandb"] = {}
        write_run(name, record)
    for backend in ("native", "hf"):
        write_run(f"compare/{backend}", synthetic_record(4, workload="code", backend=backend,
                                                        group="backend_compare_20261201-110000"))
    return load_runs(tmp_path / "runs")


@pytest.mark.parametrize("name", sorted(plots.FIGURES))
def test_figures_draw_a_mix_of_single_runs_a_sweep_and_a_backend_comparison(write_run, tmp_path, name):
    runs = _mixed_runs(write_run, tmp_path)
    fig = plots.FIGURES[name](runs)
    assert all(n <= MAX_LEGEND_ENTRIES for n in _legend_sizes(fig))
    plt.close(fig)


def test_many_groups_are_split_over_axes_so_no_legend_passes_ten_entries(write_run, tmp_path):
    for pair in "abcdefghij":
        for k in (0, 2):
            write_run(f"s/{pair}{k}", synthetic_record(k, pair=pair), synthetic_steps(k))
    runs = load_runs(tmp_path / "runs")
    for name in ("acceptance_vs_k", "latency_percentiles", "throughput_speedup"):
        fig = plots.FIGURES[name](runs)
        assert max(_legend_sizes(fig)) <= MAX_LEGEND_ENTRIES
        assert all(_has_data(ax) for ax in _plot_axes(fig))
        plt.close(fig)
