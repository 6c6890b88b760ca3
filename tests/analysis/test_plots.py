"""Every figure function returns a matplotlib Figure, with or without data to plot."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd
import pytest
from analysis_records import synthetic_record, synthetic_steps
from matplotlib.figure import Figure

from specexp.analysis import load_runs, plots


def _texts(fig: Figure) -> str:
    return " ".join(t.get_text() for ax in fig.axes for t in ax.texts)


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
        assert sum(len(ax.lines) + len(ax.patches) for ax in fig.axes) > 0
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


def test_graph_memory_plots_each_manager_per_captured_size(write_run, tmp_path):
    per_size = [{"manager": m, "size": s, "capture_bytes": s * 2**20, "capture_s": 0.01 * s}
                for m in ("draft_decode", "target_verify") for s in (1, 2, 4, 8)]
    graph = {"graph_capture_bytes": 30 * 2**20, "graph_capture_s": 0.3, "graph_capture_per_size": per_size,
             "persistent_buffer_bytes": 2**20}
    for k in (1, 2):
        write_run(f"g/{k}", synthetic_record(k, graph=graph))
    fig = plots.graph_memory(load_runs(tmp_path / "runs"))
    memory_axis = fig.axes[0]
    assert len(memory_axis.lines) == 4  # 2 managers x 2 depths
    assert list(memory_axis.lines[0].get_xdata()) == [1, 2, 4, 8]
    assert "no GPU graph data" not in _texts(fig)
    plt.close(fig)
