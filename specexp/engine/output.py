"""What the native engine hands back: one record per step and the run's output."""

from __future__ import annotations

from dataclasses import dataclass, field

from specexp.engine.request import Request


@dataclass
class StepRecord:
    """One engine step (a row of steps.parquet). Times in milliseconds.

    The phases are device time between the step's marks (CUDA events; wall clock on CPU): schedule_ms from the
    step's start to its verify (the device waiting for the host's scheduling and staging; ~0 while the host
    stages ahead of a device still busy with the step before), verify_ms, sample_ms (rejection sampler; 0 when
    the step replays a verify graph, which samples too: verify_ms then includes it), draft_ms (the draft's
    prefill and decode steps). step_ms is the host's wall time spent in step(). num_speculative_tokens: the step's
    k (`specexp.engine.depth`): its verify rows carried at most k drafts, and it proposed k per row.

    num_in_flight: requests that had arrived and were not finished when the step began (running, waiting for
    a batch slot, or finished with their last token still to be read back); num_waiting: those of them
    waiting for a batch slot or for KV blocks (`specexp.engine.arrivals`)."""

    step: int
    num_reqs: int
    num_tokens: int
    num_prefill_tokens: int
    num_drafts: int
    num_draft_tokens: int
    num_accepted_tokens: int
    num_output_tokens: int
    schedule_ms: float
    verify_ms: float
    sample_ms: float
    draft_ms: float
    step_ms: float
    num_speculative_tokens: int = 0
    num_in_flight: int = 0
    num_waiting: int = 0
    # host perf_counter seconds when step() began; from one step's start to the next's is the engine's step period
    # (`measure_fixed_ms`), which includes the draft's device time concurrent with the host's scheduling
    start_s: float = 0.0


@dataclass
class EngineOutput:
    """A `generate` call's requests (prompt order), its step records, its wall time in seconds, the bytes of
    the engine's persistent buffers, the graphs' capture/replay summary (None when the engine runs eager), and the
    step costs `adaptive: goodput` weighed (`StepCostTable.to_dict`; None in other depth modes)."""

    requests: list[Request]
    steps: list[StepRecord] = field(default_factory=list)
    total_s: float = 0.0
    persistent_buffer_bytes: int = 0
    graphs: dict | None = None
    step_costs: dict | None = None
