"""Render benchmarks/gpu_cudagraphs.py's JSON as the markdown tables of an experiments/ report (speedups are
re-derived from the raw runs with `leviathan.add_theory`, so older results get today's baseline rule).

    python benchmarks/cudagraphs_report.py RESULT.json > tables.md
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from leviathan import add_theory, count_within  # noqa: E402


def _mb(num_bytes: float | None) -> str:
    return "-" if num_bytes is None else f"{num_bytes / 2**20:.1f}"


def _kernel_lines(kernels: dict | None, top: int = 8) -> list[str]:
    """The target decode step's kernel breakdown (gpu_cudagraphs.kernel_breakdown), when measured."""
    if not kernels or "top" not in kernels:
        return []
    lines = [f"Its kernels (one eager step, profiled): {kernels['launches_per_step']:.0f} launches, "
             f"{kernels['kernel_ms_per_step']:.3f} ms of kernel time; the top {top}:", "",
             "| kernel | launches/step | ms/step |", "|---|---|---|"]
    for r in kernels["top"][:top]:
        name = r["name"].replace("|", "\\|")
        lines.append(f"| `{name[:90]}` | {r['launches_per_step']:.0f} | {r['ms_per_step']:.3f} |")
    return [*lines, ""]


def _yes_no(flag) -> str:
    return "-" if flag is None else ("yes" if flag else "no")


def _fmt(value, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _capture_lines(pair: dict) -> list[str]:
    """Graph memory / capture time per (manager, size) and the draft decode eager-vs-graph table, when measured."""
    if "capture" not in pair:
        return []
    capture = pair["capture"]
    lines = [f"Whole capture (k = 4): {_mb(capture['graph_capture_bytes'])} MiB (free-memory delta), "
             f"{capture['graph_capture_s']:.2f} s; persistent buffers {_mb(capture['persistent_buffer_bytes'])} MiB.",
             "", "| manager | batch | keys | capture MiB (free delta) | reserved MiB | capture ms |",
             "|---|---|---|---|---|---|"]
    for manager, summary in capture["managers"].items():
        for r in sorted(summary["per_size"], key=lambda r: (r["num_reqs"], r.get("max_seq_len") or 0)):
            lines.append(f"| {manager} | {r['num_reqs']} | {r.get('max_seq_len') or '-'} "
                         f"| {_mb(r['capture_bytes'])} | {_mb(r['reserved_bytes'])} | {1e3 * r['capture_s']:.1f} |")
    lines += ["", "| draft decode batch | eager ms/step | graph ms/step | graph speedup |", "|---|---|---|---|"]
    for size, d in pair["draft_decode_step"].items():
        lines.append(f"| {size} | {d['eager_step_ms']:.3f} | {d['graph_step_ms']:.3f} | {d['graph_speedup']:.1f}x |")
    return lines


def _pair(measured, predicted) -> str:
    """'measured / predicted' (either may be missing)."""
    return f"{_fmt(measured)} / {_fmt(predicted)}"


def _c_rounds(pair: dict) -> str:
    """How c was measured, for results that timed it over interleaved rounds ('' for older results)."""
    rounds = pair.get("cost_ratio_per_round")
    if not rounds:
        return ""
    return (f" (median of {len(rounds)} rounds of the two steps timed alternately, {min(rounds):.3f}-{max(rounds):.3f}; "
            f"the two steps' separate measurements above give {pair['cost_ratio_c_separate']:.3f})")


def render(result: dict) -> str:
    lines = [f"Machine: {result['machine']['gpu']}, torch {result['machine']['torch']}, "
             f"Python {result['machine']['python']}. Measured copy bandwidth (read + write): "
             f"{result['copy_bandwidth_bytes_per_s'] / 1e12:.2f} TB/s.", ""]
    switches = [f"{key}={result[key]}" for key in ("compile_pointwise", "linear_kernel", "fold_norm_weights",
                                                    "attention_kernel", "conv_kernel", "plain_decode_lookahead",
                                                    "cudagraph_prefill_tokens", "cudagraph_shared_pool")
                if key in result]
    if switches:  # results written before a switch existed leave it out
        lines += [f"Engine: {', '.join(switches)}.", ""]
    for name, pair in result["pairs"].items():
        lines += [f"## {name}", "",
                  f"Target `{pair['target']}` ({pair['target_params'] / 1e6:.0f}M params), draft `{pair['draft']}` "
                  f"({pair['draft_params'] / 1e6:.0f}M), {pair['weights']} weights, {pair['dtype']}.", ""]
        lines += _capture_lines(pair)  # each section only when the run measured it (--sections)
        if "target_decode_step" not in pair:
            continue
        t = pair["target_decode_step"]
        back_to_back = t.get("graph_back_to_back_ms")
        stream = ("" if back_to_back is None else f" Replays queued back to back: {back_to_back:.3f} ms, "
                  f"{100 * t['fraction_of_copy_bandwidth_back_to_back']:.0f}%.")
        lines += ["", f"Target decode step, batch 1: graph {t['graph_ms']:.3f} ms, eager {t['eager_ms']:.2f} ms; "
                  f"weights {t['weight_bytes'] / 1e9:.2f} GB -> {t['achieved_bytes_per_s'] / 1e12:.2f} TB/s = "
                  f"{100 * t['fraction_of_copy_bandwidth']:.0f}% of the measured copy bandwidth. "
                  f"Cost ratio c (draft step / target step, graphs) = {pair['cost_ratio_c']:.3f}{_c_rounds(pair)}."
                  f"{stream}", ""]
        lines += _kernel_lines(t.get("kernels"))
        if "end_to_end" not in pair:
            continue
        add_theory(pair["end_to_end"], pair["cost_ratio_c"])  # re-derived from the raw runs (one k = 0 baseline)
        rows = pair["end_to_end"]
        checked = [r["within_15pct_of_theory"] for r in rows if r.get("within_15pct_of_theory") is not None]
        if checked:
            lines += [f"Within 15% of the formula: {sum(checked)} of {len(checked)} points (k >= 1). Its two "
                      "factors, measured / predicted: tokens per step (acceptance length) and a step's cost in "
                      "plain decode steps (median step / median k = 0 step vs k c + 1). The cost's two parts, in "
                      "plain steps: the verify of k + 1 tokens (the formula's 1) and the draft phase per drafted "
                      "token (the formula's c).", ""]
            draft = pair.get("draft_decode_step_batch1", {})
            if t.get("graph_back_to_back_ms") and draft.get("graph_back_to_back_ms"):
                c_stream = draft["graph_back_to_back_ms"] / t["graph_back_to_back_ms"]
                within, total = count_within(rows, c_stream)
                lines += [f"With c from replays queued back to back instead (the device's time alone, c = "
                          f"{c_stream:.3f}): {within} of {total} points within 15%.", ""]
        decode = [r["decode_within_15pct_of_theory"] for r in rows
                  if r.get("decode_within_15pct_of_theory") is not None]
        if decode:
            lines += [f"The decode phase alone (a request's wall time less its prefill steps, which a draft makes "
                      f"longer): {sum(decode)} of {len(decode)} points within 15% of the formula.", ""]
        lines += ["| k | acceptance rate | tokens/s (median of runs) | speedup | theory speedup | within 15% "
                  "| decode-phase speedup (within 15%) | prefill step ms "
                  "| acceptance length / theory | step cost / theory | verify / 1 | draft per token / c "
                  "| step ms p50 | draft ms p50 | verify ms p50 | host ms p50 |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            lines.append(
                f"| {r['k']} | {r['acceptance_rate'] if r['acceptance_rate'] is not None else 'real'} "
                f"| {r['output_tokens_per_s']:.1f} | {r['speedup']:.2f} | {_fmt(r.get('theory_speedup'))} "
                f"| {_yes_no(r.get('within_15pct_of_theory'))} "
                f"| {_fmt(r.get('decode_speedup'))} ({_yes_no(r.get('decode_within_15pct_of_theory'))}) "
                f"| {_fmt(r.get('prefill_step_ms_mean'), 1)} "
                f"| {_pair(r['acceptance_length'], r.get('theory_acceptance_length'))} "
                f"| {_pair(r.get('step_cost_in_plain_steps'), r.get('theory_step_cost_in_plain_steps'))} "
                f"| {_pair(r.get('verify_cost_in_plain_steps'), 1.0 if 'verify_cost_in_plain_steps' in r else None)} "
                f"| {_pair(r.get('draft_cost_per_token_in_plain_steps'), pair['cost_ratio_c'] if r['k'] else None)} "
                f"| {r['step_ms_p50']:.2f} | {r['draft_ms_p50']:.2f} | {r['verify_ms_p50']:.2f} "
                f"| {_fmt(r.get('schedule_ms_p50'))} |")
        lines.append("")
    for name, err in result.get("errors", {}).items():
        lines += [f"## {name}: failed", "", "```", err.strip().splitlines()[-1], "```", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    print(render(json.load(open(sys.argv[1]))))
