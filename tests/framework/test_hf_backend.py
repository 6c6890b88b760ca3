"""Backend hf: assisted generation with counted acceptance."""

import json
import math
import shutil

import pytest
from omegaconf import OmegaConf

from specexp.backends import get_backend
from specexp.cli import compose_config
from specexp.experiment import RunContext, build_run_spec

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def run_hf(tmp_path, target, draft, k, *extra, num_prompts=2, input_len=6, output_len=12):
    overrides = ["pair=local", f"pair.target.path={target}", f"pair.draft.path={draft}",
                 f"speculator.num_speculative_tokens={k}", f"workload.num_prompts={num_prompts}",
                 f"workload.input_len={input_len}", f"workload.output_len={output_len}", "backend=hf", *extra]
    cfg = OmegaConf.to_container(compose_config(overrides), resolve=True)
    spec = build_run_spec(cfg, RunContext(run_dir=tmp_path, experiment="test"))
    return get_backend("hf").run(spec)


@pytest.mark.parametrize("k", [1, 3, 5])
def test_k_drafts_are_proposed_every_step_that_has_room(tmp_path, tiny_llama_dir, tiny_llama_draft_dir, k):
    output_len = 12
    result = run_hf(tmp_path, tiny_llama_dir, tiny_llama_draft_dir, k, output_len=output_len)
    for request in result.requests:
        steps = [s for s in result.steps if s.request_id == request.prompt_id]
        emitted = 0
        for step in steps:
            room = output_len - emitted - 1  # assisted generation keeps one slot for the target's own token
            assert step.num_draft_tokens == min(k, room), (step, emitted)
            emitted += step.num_output_tokens
        assert emitted == len(request.output_token_ids) == output_len
    m = result.metrics
    assert m["drafted_per_position"][k - 1] > 0
    assert m["num_draft_tokens"] == sum(s.num_draft_tokens for s in result.steps)


@pytest.mark.parametrize("k", [2, 4])
def test_a_model_drafting_for_itself_is_fully_accepted_and_lossless(tmp_path, tiny_llama_dir, k):
    spec_run = run_hf(tmp_path, tiny_llama_dir, tiny_llama_dir, k)
    plain_run = run_hf(tmp_path, tiny_llama_dir, tiny_llama_dir, 0)
    m = spec_run.metrics
    assert m["num_accepted_tokens"] == m["num_draft_tokens"] > 0
    assert m["draft_acceptance_rate"] == 1.0
    assert [r.output_token_ids for r in spec_run.requests] == [r.output_token_ids for r in plain_run.requests]


def test_independent_draft_counts_match_the_identities(tmp_path, tiny_lfm2_dir, tiny_lfm2_draft_dir):
    result = run_hf(tmp_path, tiny_lfm2_dir, tiny_lfm2_draft_dir, 3, "sampling=sample")
    m = result.metrics
    assert m["num_drafts"] == sum(s.num_drafts for s in result.steps) > 0
    assert math.isclose(m["acceptance_length"], 1 + m["num_accepted_tokens"] / m["num_drafts"])
    assert all(a >= b for a, b in zip(m["accepted_per_position"], m["accepted_per_position"][1:]))
    assert sum(m["acceptance_histogram"]) == m["num_drafts"]
    assert set(m["acceptance_histogram_per_request"]) == {r.prompt_id for r in result.requests}


def test_plain_generate_at_depth_0_has_no_drafts(tmp_path, tiny_llama_dir, tiny_llama_draft_dir):
    result = run_hf(tmp_path, tiny_llama_dir, tiny_llama_draft_dir, 0, num_prompts=1)
    m = result.metrics
    assert (m["num_drafts"], m["acceptance_length"], m["draft_acceptance_rate"]) == (0, 1.0, None)
    assert all(s.num_output_tokens == 1 for s in result.steps)
    assert result.steps[0].num_tokens == 6  # the prefill step covers the prompt


def test_latency_and_graph_metrics(tmp_path, tiny_llama_dir, tiny_llama_draft_dir):
    result = run_hf(tmp_path, tiny_llama_dir, tiny_llama_draft_dir, 2)
    m = result.metrics
    for key in ("ttft_ms", "tpot_ms", "e2e_ms"):
        assert 0 < m[key]["p50"] <= m[key]["p99"]
    assert m["output_tokens_per_s"] > 0
    assert all(m[key] is None for key in ("graph_capture_bytes", "graph_capture_s", "persistent_buffer_bytes"))
    for r in result.requests:
        assert sum(r.accept_lengths) == len(r.output_token_ids)
        assert r.ttft_ms <= r.e2e_ms
    assert result.env["device"] == "cpu"


def _with_eos(model_dir, eos, out_dir):
    """A copy of checkpoint ``model_dir`` whose EOS token is ``eos``."""
    shutil.copytree(model_dir, out_dir)
    for name in ("config.json", "generation_config.json"):
        path = out_dir / name
        path.write_text(json.dumps({**json.loads(path.read_text()), "eos_token_id": eos}))
    return out_dir


def test_eos_stops_generation_unless_ignored(tmp_path, tiny_llama_dir, tiny_llama_draft_dir):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "The quick brown fox"}) + "\n")
    jsonl = ["workload=jsonl", f"workload.path={prompts}", "sampling.max_new_tokens=20"]

    def output(target, draft, *extra):
        return run_hf(tmp_path, target, draft, 2, *jsonl, *extra).requests[0].output_token_ids

    full = output(tiny_llama_dir, tiny_llama_draft_dir, "sampling.ignore_eos=true")
    eos = full[7]  # make a token the target emits mid-way the EOS of both models
    target = _with_eos(tiny_llama_dir, eos, tmp_path / "target")
    draft = _with_eos(tiny_llama_draft_dir, eos, tmp_path / "draft")
    assert output(target, draft, "sampling.ignore_eos=true") == full
    assert output(target, draft) == full[: full.index(eos) + 1]
