"""Per-token acceptance traces: ``traces.parquet``, one row per (request, step) of a run (docs/design.md §5).

A row holds the step's ``k``, the request's ``num_query_tokens``, ``is_prefill``, ``num_draft_tokens`` (drafts
it could accept; 0: not a draft), ``num_accepted_tokens``, ``num_emitted_tokens``, and the step's
``num_reqs`` (batch size) and ``step_ms``. Every acceptance counter of ``result.json`` follows from these rows
alone (:func:`acceptance_from_traces`): the traces are the run's exact per-request, per-step record, not a
server-cumulative counter.

    traces = load_traces("experiments/runs/load_sweep_<time>/3")
    acceptance_from_traces(traces, k=4)["acceptance_length"]
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from specexp.engine.stats import AcceptanceStats

TRACES_FILE = "traces.parquet"
COLUMNS = ("step", "prompt_id", "k", "num_query_tokens", "is_prefill", "num_draft_tokens", "num_accepted_tokens",
           "num_emitted_tokens", "num_reqs", "step_ms")


def load_traces(run_dir: str | Path) -> pd.DataFrame:
    """The traces of one run directory, in request then step order (columns: :data:`COLUMNS`); an empty frame
    of those columns where the backend records none (vLLM)."""
    path = Path(run_dir) / TRACES_FILE
    if not path.is_file():
        return pd.DataFrame(columns=list(COLUMNS))
    return pd.read_parquet(path)


def acceptance_from_traces(traces: pd.DataFrame, k: int) -> dict:
    """The acceptance counters of a run recomputed from its traces: the §4 acceptance metrics
    (``num_drafts``, ``acceptance_length``, ``per_position_acceptance``, ``acceptance_histogram``, ...), plus
    ``acceptance_histogram_per_request`` ({prompt_id: histogram}), ``num_output_tokens`` and
    ``accept_lengths`` ({prompt_id: tokens emitted at each step that emitted}), counted as the engine counts
    them. k: the run's maximum depth (the length of the per-position arrays)."""
    stats = AcceptanceStats(k)
    accept_lengths: dict[str, list[int]] = {}
    for row in traces.itertuples(index=False):
        pid = str(row.prompt_id)
        if row.num_draft_tokens > 0:  # a row without drafts is not a draft (§4)
            stats.record(pid, int(row.num_draft_tokens), int(row.num_accepted_tokens))
        lengths = accept_lengths.setdefault(pid, [])
        if row.num_emitted_tokens > 0:
            lengths.append(int(row.num_emitted_tokens))
    return {
        **stats.metrics(),
        "acceptance_histogram_per_request": stats.histograms_per_request(),
        "num_output_tokens": int(traces["num_emitted_tokens"].sum()) if len(traces) else 0,
        "accept_lengths": accept_lengths,
    }


def output_positions(traces: pd.DataFrame) -> pd.Series:
    """Per trace row, the output position its first draft proposes: the tokens its request had emitted
    before that step (traces in request then step order)."""
    emitted = traces.groupby("prompt_id", sort=False)["num_emitted_tokens"]
    return (emitted.cumsum() - traces["num_emitted_tokens"]).astype(int)
