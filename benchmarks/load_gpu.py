"""Serving load on one GPU: output tokens/s, TPOT and the verify share against concurrency, native and vLLM.

Per pair (random-weight 1B-class shapes, bf16, synthetic acceptance `--rate`) and per k, ONE engine with room for
the largest concurrency (`max_num_seqs` = max of `--concurrency`) serves, at each concurrency c, a closed loop: c
requests in flight, a new one starting when one finishes (what `workload.arrival=concurrency` runs and `vllm bench
serve --max-concurrency` measures), max(4c, 16) prompts of 64 random tokens, `--new-tokens` tokens each, EOS
ignored. Each engine is built in turn (one at a time on the GPU) and runs one unmeasured round over every c,
then `--repeats` measured rounds over every c.

- `--engine native`: `NativeEngine.generate(max_concurrency=c)` with `engine=cuda`'s kernels and graphs at
  1, 2, 4, ... 64 rows; mixed prefill+verify steps replay joined graphs (`specexp.engine.mixed_graphs`). Per run also the
  verify share (target verify time over the step's GPU time) and the mixed steps' median GPU time.
- `--engine vllm`: `vllm.LLM` (0.26: `speculative_config` method `draft_model`, synthetic rejection at the same
  per-position rates as native) driven through `llm.llm_engine.add_request`/`step()`, the loop `LLM.generate` runs,
  topped up to c requests after every step. TTFT/TPOT from the host's clock at each step's outputs. Prefix caching
  is off unless `--vllm-prefix-caching on`: every round repeats its prompts.

    python benchmarks/load_gpu.py --engine native --out load_native.json [--pairs llama-3.2-1b+llama-100m]
        [--ks 0,2,4,6] [--concurrency 1,2,4,8,16,32,64] [--repeats 2] [--rate 0.8] [--new-tokens 128]
    VLLM_USE_FLASHINFER_SAMPLER=0 python benchmarks/load_gpu.py --engine vllm --out load_vllm.json --ks 0,4

The JSON is rewritten after every (pair, k) round, so a run cut short keeps what it finished; `load_gpu_report.py`
renders the tables and figures.
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_cudagraphs import CUDA_KERNELS, DEMO_PAIRS, RANDOM_PAIRS, ZOO, timed_generate

from specexp.analysis.oracle import prefill_ms_per_token, step_costs
from specexp.engine.config import EngineConfig, SamplingConfig, SpeculatorConfig
from specexp.engine.cudagraph import FULL
from specexp.engine.stats import percentile
from specexp.measure.intervals import repeat_summary
from specexp.models import load_model

PROMPT_TOKENS = 64


def num_prompts(concurrency: int) -> int:
    """Prompts a run at concurrency c serves: four per slot, at least 16."""
    return max(4 * concurrency, 16)


def make_prompts(vocab: int, num: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(0)
    return [torch.randint(3, vocab, (PROMPT_TOKENS,), generator=gen).tolist() for _ in range(num)]


def latency_figures(tpot_ms: list[float], ttft_ms: list[float], tokens: int, wall_s: float) -> dict:
    """A run's figures from per-request TPOT/TTFT (ms), its output tokens and wall time (s)."""
    return {"output_tokens_per_s": tokens / wall_s, "wall_s": wall_s, "output_tokens": tokens,
            "tokens_per_s_per_user": 1e3 / statistics.median(tpot_ms) if tpot_ms else None,
            "tpot_ms_p50": percentile(tpot_ms, 50), "tpot_ms_p99": percentile(tpot_ms, 99),
            "ttft_ms_p50": percentile(ttft_ms, 50), "ttft_ms_p99": percentile(ttft_ms, 99)}


# ---------------------------------------------------------------------------------------------- native
class NativeServer:
    """One native engine at K = k for a pair: graphs at 1, 2, 4, ... max concurrency rows."""

    def __init__(self, target, draft, k: int, rate: float, max_concurrency: int, new_tokens: int,
                 device: str = "cuda") -> None:
        from specexp.engine.cudagraph import default_capture_sizes
        from specexp.engine.runner import NativeEngine

        max_model_len = -(-(PROMPT_TOKENS + new_tokens + k + 2) // 16) * 16
        kernels = CUDA_KERNELS if device == "cuda" else {"cudagraph_prefill_tokens": (16, 32, 64, 128)}
        engine = EngineConfig(device=device, dtype=str(target.lm_head.weight.dtype).replace("torch.", ""),
                              max_num_seqs=max_concurrency, max_model_len=max_model_len, block_size=16,
                              cudagraph_mode=FULL, cudagraph_capture_sizes=default_capture_sizes(max_concurrency),
                              **kernels)
        spec = SpeculatorConfig(num_speculative_tokens=k, cudagraph_mode=FULL, rejection="synthetic",
                                synthetic_acceptance_rate=rate)
        self.engine = NativeEngine(target, draft if k > 0 else None, engine, spec,
                                   SamplingConfig(temperature=0.0, max_new_tokens=new_tokens, ignore_eos=True),
                                   emulate_graphs_on_cpu=device != "cuda")
        summary = self.engine.graph_summary() or {}
        self.info = {"graph_capture_bytes": summary.get("graph_capture_bytes"),
                     "graph_capture_s": summary.get("graph_capture_s")}

    def run(self, prompts: list[list[int]], concurrency: int) -> dict:
        engine = self.engine
        parts_before, joined_before = engine.num_mixed_in_parts, engine.num_mixed_joined
        prompts_before, eager_before = engine.num_prompt_batches_graphed, engine.verify_graphs.num_eager
        out = timed_generate(engine, prompts, max_concurrency=concurrency)
        tpot, ttft = [], []
        for r in out.requests:
            first = r.first_token_s if r.first_token_s is not None else r.finish_s
            ttft.append((first - r.arrival_s) * 1e3)
            if r.num_output_tokens > 1:
                tpot.append((r.finish_s - first) * 1e3 / (r.num_output_tokens - 1))
        tokens = sum(r.num_output_tokens for r in out.requests)
        steps = out.steps
        device = [s.schedule_ms + s.verify_ms + s.sample_ms + s.draft_ms for s in steps]
        mixed = [d for s, d in zip(steps, device) if 0 < s.num_prefill_tokens < s.num_tokens]
        pure = [d for s, d in zip(steps, device) if s.num_prefill_tokens == 0 and s.num_reqs == concurrency]
        drafts = sum(s.num_drafts for s in steps)
        self.last_traces, self.last_steps = trace_frame(out), step_frame(steps)
        costs = step_costs({0: self.last_steps})[0]
        return {**latency_figures(tpot, ttft, tokens, out.total_s),
                "step_ms_by_batch": {str(b): ms for b, ms in costs.items()},
                "prefill_ms_per_token": prefill_ms_per_token(self.last_steps, costs),
                "acceptance_length": 1 + sum(s.num_accepted_tokens for s in steps) / drafts if drafts else 1.0,
                "verify_share": sum(s.verify_ms + s.sample_ms for s in steps) / sum(device) if sum(device) else None,
                "mean_batch_occupancy": sum(s.num_reqs for s in steps) / len(steps) / concurrency,
                "steps": len(steps), "mixed_steps": len(mixed),
                "mixed_steps_in_parts": engine.num_mixed_in_parts - parts_before,
                "mixed_steps_joined": engine.num_mixed_joined - joined_before,
                "prompt_batches_graphed": engine.num_prompt_batches_graphed - prompts_before,
                "eager_steps": engine.verify_graphs.num_eager - eager_before,
                "mixed_step_ms_p50": statistics.median(mixed) if mixed else None,
                "pure_step_ms_p50": statistics.median(pure) if pure else None}

    def close(self) -> None:
        del self.engine
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def step_frame(steps):
    """A `generate` call's steps in order: batch size, the host's step period (ms) and prompt tokens of each."""
    import pandas as pd

    return pd.DataFrame([(s.num_reqs, s.step_ms, s.num_prefill_tokens) for s in steps],
                        columns=["num_reqs", "step_ms", "num_prefill_tokens"])


def trace_frame(out):
    """One row per (request, step) of a `generate` call, the columns `specexp.analysis.oracle` reads."""
    import pandas as pd

    rows = [(t.step, out.steps[t.step].num_reqs, t.num_query_tokens, t.is_prefill, t.num_draft_tokens,
             t.num_accepted_tokens, t.num_emitted_tokens) for r in out.requests for t in r.trace]
    return pd.DataFrame(rows, columns=["step", "num_reqs", "num_query_tokens", "is_prefill", "num_draft_tokens",
                                       "num_accepted_tokens", "num_emitted_tokens"])


def oracle_cells(runs_by_k: dict[int, dict[int, list[dict]]], traces: dict[int, list], levels: list[int]) -> dict:
    """Per concurrency, what choosing k could win (`specexp.analysis.oracle.oracle_rounds`): on each measured
    round's steps of the deepest k (its traces), with every k's decode step cost by batch size and cost per prompt
    token from the same round, the modelled best static k and its speedup over k = 0, and the per-step hindsight
    oracle's speedup and mean k; each summarised over the rounds (mean ± std, 95% interval, n)."""
    from specexp.analysis.oracle import oracle_rounds

    cells = {}
    for c in levels:
        rounds = [(frame,
                   {k: {int(b): ms for b, ms in runs[c][r]["step_ms_by_batch"].items()}
                    for k, runs in runs_by_k.items()},
                   {k: runs[c][r]["prefill_ms_per_token"] for k, runs in runs_by_k.items()})
                  for r, frame in enumerate(traces[c])]
        per_round = oracle_rounds(rounds)
        cells[str(c)] = {"model_best_static_k": per_round["best_static_k"],
                         **{name: repeat_summary(per_round[name])
                            for name in ("model_best_static_speedup", "oracle_speedup", "oracle_k_mean")}}
    return cells


# ---------------------------------------------------------------------------------------------- vLLM
def random_checkpoint(path: Path, seed: int, dest: Path) -> str:
    """The native loader's seeded random weights of the model at `path`, written as a checkpoint vLLM loads."""
    from specexp.backends.vllm import materialize_random_weights

    spec = SimpleNamespace(pair=SimpleNamespace(dtype="bfloat16", init_seed=seed))
    return materialize_random_weights(SimpleNamespace(path=str(path)), spec, dest, device="cuda")


class VllmServer:
    """One `vllm.LLM` at k (synthetic rejection at the native engine's per-position rates)."""

    def __init__(self, target_dir: str, draft_dir: str, k: int, rate: float, max_concurrency: int,
                 new_tokens: int, prefix_caching: bool = False) -> None:
        import vllm

        self.vllm = vllm
        kwargs = dict(model=target_dir, tokenizer=target_dir, skip_tokenizer_init=True, dtype="bfloat16", seed=0,
                      max_num_seqs=max_concurrency, max_model_len=-(-(PROMPT_TOKENS + new_tokens + k + 2) // 16) * 16,
                      gpu_memory_utilization=0.85, disable_log_stats=False, enable_prefix_caching=prefix_caching)
        if k > 0:
            rates = SpeculatorConfig(num_speculative_tokens=k, rejection="synthetic",
                                     synthetic_acceptance_rate=rate).synthetic_rates()
            kwargs["speculative_config"] = {"method": "draft_model", "model": draft_dir, "num_speculative_tokens": k,
                                            "rejection_sample_method": "synthetic",
                                            "synthetic_acceptance_rates": list(rates)}
        start = time.perf_counter()
        self.llm = vllm.LLM(**kwargs)
        self.info = {"engine_build_s": time.perf_counter() - start, "vllm": vllm.__version__,
                     "enable_prefix_caching": prefix_caching}
        self.params = vllm.SamplingParams(max_tokens=new_tokens, ignore_eos=True, temperature=0.0, detokenize=False)
        self.k = k

    def run(self, prompts: list[list[int]], concurrency: int) -> dict:
        engine = self.llm.llm_engine
        pending = list(enumerate(prompts))[::-1]
        started, first, done, tokens = {}, {}, {}, {}
        next_id = 0

        def admit() -> None:
            nonlocal next_id
            index, ids = pending.pop()
            rid = f"r{next_id}-{index}"
            next_id += 1
            started[rid] = time.perf_counter()
            engine.add_request(rid, {"prompt_token_ids": ids}, self.params)

        gc.collect()
        gc.disable()
        t0 = time.perf_counter()
        try:
            while pending and len(started) - len(done) < concurrency:
                admit()
            while engine.has_unfinished_requests():
                outputs = engine.step()
                now = time.perf_counter()
                for out in outputs:
                    n = len(out.outputs[0].token_ids)
                    if n and out.request_id not in first:
                        first[out.request_id] = now
                    if out.finished:
                        done[out.request_id], tokens[out.request_id] = now, n
                while pending and len(started) - len(done) < concurrency:
                    admit()
        finally:
            gc.enable()
        wall = time.perf_counter() - t0
        ttft = [(first[r] - started[r]) * 1e3 for r in done]
        tpot = [(done[r] - first[r]) * 1e3 / (tokens[r] - 1) for r in done if tokens[r] > 1]
        return latency_figures(tpot, ttft, sum(tokens.values()), wall)

    def close(self) -> None:
        del self.llm
        gc.collect()
        torch.cuda.empty_cache()


# ---------------------------------------------------------------------------------------------- driver
def summarize(runs: list[dict]) -> dict:
    """A (k, concurrency) cell: each figure's mean ± std and 95% interval over the measured rounds."""
    names = [n for n in runs[0] if isinstance(runs[0][n], (int, float))]
    return {**{n: repeat_summary([r[n] for r in runs]) for n in names}, "runs": runs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", choices=("native", "vllm"), default="native")
    parser.add_argument("--pairs", default="llama-3.2-1b+llama-100m,lfm2-1.2b+lfm2-350m")
    parser.add_argument("--ks", default="0,2,4,6")
    parser.add_argument("--concurrency", default="1,2,4,8,16,32,64")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--rate", type=float, default=0.8)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--device", default="cuda", help="cuda, or cpu: a check of the native path on emulated graphs "
                                                             "with the trained demo models, not a measurement")
    parser.add_argument("--vllm-prefix-caching", choices=("on", "off"), default="off",
                        help="vLLM's prefix cache (its own default is on; the rounds repeat their prompts, which it "
                             "would serve from the cache; the native engine has none)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    ks = [int(k) for k in args.ks.split(",")]
    levels = sorted(int(c) for c in args.concurrency.split(","))
    out_path = Path(args.out)
    cuda = args.device == "cuda"
    result = {"date": time.strftime("%Y-%m-%d"), "gpu": torch.cuda.get_device_name(0) if cuda else platform.processor(),
              "torch": torch.__version__,
              "python": platform.python_version(), "engine": args.engine, "rate": args.rate,
              "prompt_tokens": PROMPT_TOKENS, "new_tokens": args.new_tokens, "repeats": args.repeats,
              "concurrency": levels, "pairs": {}}
    for pair in args.pairs.split(","):
        pairs = RANDOM_PAIRS if cuda else DEMO_PAIRS
        if pair not in pairs:
            raise SystemExit(f"--pairs: unknown pair {pair!r}: valid are {', '.join(pairs)}")
        target_path, draft_path = pairs[pair]
        result["pairs"][pair] = {}
        if args.engine == "native":
            dtype, weights = (torch.bfloat16, "random") if cuda else (torch.float32, "trained")
            target = load_model(ZOO / target_path, dtype=dtype, device=args.device, weights=weights, seed=0)
            draft = load_model(ZOO / draft_path, dtype=dtype, device=args.device, weights=weights, seed=1)
            vocab = target.config.vocab_size
        else:
            scratch = Path(tempfile.mkdtemp(prefix="load-vllm-"))
            target_dir = random_checkpoint(ZOO / target_path, 0, scratch / "target")
            draft_dir = random_checkpoint(ZOO / draft_path, 1, scratch / "draft")
            vocab = json.loads((ZOO / target_path / "config.json").read_text())["vocab_size"]
        prompts = {c: make_prompts(vocab, num_prompts(c)) for c in levels}
        runs_by_k, deepest_traces = {}, {}
        for k in sorted(ks):
            start = time.perf_counter()
            if args.engine == "native":
                server = NativeServer(target, draft, k, args.rate, max(levels), args.new_tokens, args.device)
            else:
                server = VllmServer(target_dir, draft_dir, k, args.rate, max(levels), args.new_tokens,
                                    args.vllm_prefix_caching == "on")
            build_s = time.perf_counter() - start
            for c in levels:  # warm-up round
                server.run(prompts[c][: 2 * c], c)
            runs = {c: [] for c in levels}
            traces = {c: [] for c in levels}
            for _ in range(args.repeats):
                for c in levels:
                    runs[c].append(server.run(prompts[c], c))
                    if args.engine == "native":
                        traces[c].append(server.last_traces)
            runs_by_k[k], deepest_traces = runs, traces
            cells = {str(c): summarize(r) for c, r in runs.items()}
            result["pairs"][pair][f"k{k}"] = {"build_s": build_s, **server.info, "cells": cells}
            print(f"{pair} k={k}: " + ", ".join(
                f"c{c} {cells[str(c)]['output_tokens_per_s']['mean']:.0f}" for c in levels) + " tokens/s", flush=True)
            server.close()
            if args.engine == "native" and 0 in runs_by_k and len(runs_by_k) > 1 and k == max(ks):
                result["pairs"][pair]["oracle"] = {"max_k": k, "cells": oracle_cells(runs_by_k, deepest_traces, levels)}
            out_path.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
