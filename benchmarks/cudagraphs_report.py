"""Markdown tables of `gpu_cudagraphs.py` and `diagnostics/verify_cost.py` results, as the CUDA-graph report
(`experiments/2026-11-29-cudagraphs-h200/`) prints them. Speedups are re-derived from each result's raw runs by
`leviathan.add_theory` (one k = 0 baseline per pair: the median of all its k = 0 runs), so an older result gets
today's baseline rule. Needs only the standard library and PyYAML (for `conf/engine/cuda.yaml`).

    python benchmarks/cudagraphs_report.py full RESULT.json            # every table of one result
    python benchmarks/cudagraphs_report.py summary RESULT.json ...     # one row per (result, pair): step, c, end to end
    python benchmarks/cudagraphs_report.py memory RESULT.json ...      # graph memory per manager (--sections capture)
    python benchmarks/cudagraphs_report.py speedups RESULT.json ...    # end-to-end speedup per k: measured / formula
    python benchmarks/cudagraphs_report.py phases RESULT.json ...      # per k: draft, verify and step medians, side by side
    python benchmarks/cudagraphs_report.py verify VERIFY_COST.json ... # verify and draft graphs in plain decode steps

`cudagraphs_report.py RESULT.json` alone means `full`. Tables name each result by its file name.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

from leviathan import add_theory, count_within, realized_speedup, within_tolerance

ENGINE_DEFAULTS_YAML = Path(__file__).resolve().parents[1] / "conf" / "engine" / "cuda.yaml"
# The engine switches gpu_cudagraphs.py records in its result, compared with conf/engine/cuda.yaml's values
SWITCHES = ("compile_pointwise", "linear_kernel", "silu_in_down_gemv", "silu_in_gate_up", "fold_norm_weights",
            "attention_kernel", "conv_kernel", "argmax_kernel", "sampler_kernel", "draft_step_kernel",
            "programmatic_launch", "gemv_early_launch", "skinny_early_launch", "plain_decode_lookahead",
            "cudagraph_prefill_tokens",
            "cudagraph_shared_pool", "steady_inputs_on_device", "draft_prefill_region")
# what results written before a switch existed ran: the behaviour the switch's first default kept
BEFORE_THE_SWITCH = {"argmax_kernel": "torch", "silu_in_down_gemv": False, "silu_in_gate_up": False,
                     "sampler_kernel": "torch", "draft_step_kernel": "torch", "programmatic_launch": False,
                     "gemv_early_launch": "both", "skinny_early_launch": "both", "steady_inputs_on_device": False,
                     "draft_prefill_region": "full"}
SHORT_PAIR = {"lfm2-1.2b+lfm2-350m": "LFM2-1.2B + 350M", "llama-3.2-1b+llama-100m": "Llama-3.2-1B + 100M"}
# graph managers grouped as the memory table shows them (prompt-graph managers carry their token count)
MANAGER_GROUPS = (("target verify", "target_verify"), ("target prompt graphs", "target_prefill_"),
                  ("draft prefill", "draft_prefill"), ("draft prompt graphs", "draft_prompt_prefill_"),
                  ("draft decode", "draft_decode"))


def _mb(num_bytes: float | None) -> str:
    return "-" if num_bytes is None else f"{num_bytes / 2**20:.1f}"


def _fmt(value, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _span(values: list[float], digits: int = 2) -> str:
    """'a' or 'lo-hi' of the values ('-' for none)."""
    if not values:
        return "-"
    lo, hi = f"{min(values):.{digits}f}", f"{max(values):.{digits}f}"
    return lo if lo == hi else f"{lo}-{hi}"


def _yes_no(flag) -> str:
    return "-" if flag is None else ("yes" if flag else "no")


def _pair_name(name: str) -> str:
    return SHORT_PAIR.get(name, name)


def load(path: str) -> dict:
    """A result, with `file` (its base name) added."""
    return {**json.loads(Path(path).read_text()), "file": Path(path).name}


def engine_defaults() -> dict:
    """conf/engine/cuda.yaml's values of the switches gpu_cudagraphs.py records (today's `engine=cuda`)."""
    conf = yaml.safe_load(ENGINE_DEFAULTS_YAML.read_text())
    return {key: conf[key] for key in SWITCHES}


def switches_off_default(result: dict, defaults: dict) -> list[str]:
    """The recorded engine switches that differ from `defaults`, as `key=value`; a switch the result does not
    record (it predates the switch) as `no key`."""
    out = []
    for key in SWITCHES:
        if result.get(key) is None and key in BEFORE_THE_SWITCH:
            result = {**result, key: BEFORE_THE_SWITCH[key]}
        if key not in result or result[key] is None:
            out.append(f"no `{key}`")
        elif (list(result[key]) if isinstance(result[key], (list, tuple)) else result[key]) != defaults[key]:
            out.append(f"`{key}={result[key]}`")
    return out


# ------------------------------------------------------------------------------------------------------- full


def _kernel_lines(kernels: dict | None, top: int = 8) -> list[str]:
    """The target decode step's kernel breakdown (gpu_cudagraphs.kernel_breakdown), when measured."""
    if not kernels or "top" not in kernels:
        return []
    # results written before `profiled` was recorded profiled one eager step
    lines = [(f"Its kernels ({kernels.get('profiled', 'one eager step')}, profiled): "
              f"{kernels['launches_per_step']:.0f} launches, "
             f"{kernels['kernel_ms_per_step']:.3f} ms of kernel time; the top {top}:"), "",
             "| kernel | launches/step | ms/step |", "|---|---|---|"]
    for r in kernels["top"][:top]:
        name = r["name"].replace("|", "\\|")
        lines.append(f"| `{name[:90]}` | {r['launches_per_step']:.0f} | {r['ms_per_step']:.3f} |")
    return [*lines, ""]


def _capture_lines(pair: dict) -> list[str]:
    """Graph memory / capture time per (manager, size) and the draft decode eager-vs-graph table, when measured."""
    if "capture" not in pair:
        return []
    capture = pair["capture"]
    lines = [(f"Whole capture (k = 4): {_mb(capture['graph_capture_bytes'])} MiB (free-memory delta), "
             f"{capture['graph_capture_s']:.2f} s; persistent buffers {_mb(capture['persistent_buffer_bytes'])} MiB."),
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


def _measured_predicted(measured, predicted) -> str:
    return f"{_fmt(measured)} / {_fmt(predicted)}"


def _c_rounds(pair: dict) -> str:
    """How c was measured, for results that timed it over interleaved rounds ('' for older results)."""
    rounds = pair.get("cost_ratio_per_round")
    if not rounds:
        return ""
    return (f" (median of {len(rounds)} rounds of the two steps timed alternately, {min(rounds):.3f}-{max(rounds):.3f}; "
            f"the two steps' separate measurements above give {pair['cost_ratio_c_separate']:.3f})")


def render_full(result: dict) -> str:
    """Every table of one gpu_cudagraphs.py result: capture per (manager, size), the batch-1 steps, end to end."""
    lines = [(f"Machine: {result['machine']['gpu']}, torch {result['machine']['torch']}, "
             f"Python {result['machine']['python']}. Measured copy bandwidth (read + write): "
             f"{result['copy_bandwidth_bytes_per_s'] / 1e12:.2f} TB/s."), ""]
    switches = [f"{key}={result[key]}" for key in SWITCHES if key in result]
    if switches:  # results written before a switch existed leave it out
        lines += [f"Engine: {', '.join(switches)}.", ""]
    for name, pair in result["pairs"].items():
        lines += [f"## {name}", "",
                  (f"Target `{pair['target']}` ({pair['target_params'] / 1e6:.0f}M params), draft `{pair['draft']}` "
                  f"({pair['draft_params'] / 1e6:.0f}M), {pair['weights']} weights, {pair['dtype']}."), ""]
        lines += _capture_lines(pair)  # each section only when the run measured it (--sections)
        if "target_decode_step" not in pair:
            continue
        t = pair["target_decode_step"]
        back_to_back = t.get("graph_back_to_back_ms")
        stream = ("" if back_to_back is None else f" Replays queued back to back: {back_to_back:.3f} ms, "
                  f"{100 * t['fraction_of_copy_bandwidth_back_to_back']:.0f}%.")
        lines += ["", (f"Target decode step, batch 1: graph {t['graph_ms']:.3f} ms, eager {t['eager_ms']:.2f} ms; "
                  f"weights {t['weight_bytes'] / 1e9:.2f} GB -> {t['achieved_bytes_per_s'] / 1e12:.2f} TB/s = "
                  f"{100 * t['fraction_of_copy_bandwidth']:.0f}% of the measured copy bandwidth. "
                  f"Cost ratio c (draft step / target step, graphs) = {pair['cost_ratio_c']:.3f}{_c_rounds(pair)}."
                  f"{stream}"), ""]
        lines += _kernel_lines(t.get("kernels"))
        if "end_to_end" not in pair:
            continue
        add_theory(pair["end_to_end"], pair["cost_ratio_c"])  # re-derived from the raw runs (one k = 0 baseline)
        rows = pair["end_to_end"]
        checked = [r["within_15pct_of_theory"] for r in rows if r.get("within_15pct_of_theory") is not None]
        if checked:
            lines += [(f"Within 15% of the formula: {sum(checked)} of {len(checked)} points (k >= 1). Its two "
                      "factors, measured / predicted: tokens per step (acceptance length) and a step's cost in "
                      "plain decode steps (median step / median k = 0 step vs k c + 1). The cost's two parts, in "
                      "plain steps: the verify of k + 1 tokens (the formula's 1) and the draft phase per drafted "
                      "token (the formula's c)."), ""]
            draft = pair.get("draft_decode_step_batch1", {})
            if t.get("graph_back_to_back_ms") and draft.get("graph_back_to_back_ms"):
                c_stream = draft["graph_back_to_back_ms"] / t["graph_back_to_back_ms"]
                within, total = count_within(rows, c_stream)
                lines += [(f"With c from replays queued back to back instead (the device's time alone, c = "
                          f"{c_stream:.3f}): {within} of {total} points within 15%."), ""]
        decode = [r["decode_within_15pct_of_theory"] for r in rows
                  if r.get("decode_within_15pct_of_theory") is not None]
        if decode:
            lines += [(f"The decode phase alone (a request's wall time less its prefill steps, which a draft makes "
                      f"longer): {sum(decode)} of {len(decode)} points within 15% of the formula."), ""]
        lines += [("| k | acceptance rate | tokens/s (median of runs) | speedup | theory speedup | within 15% "
                  "| decode-phase speedup (within 15%) | prefill step ms "
                  "| acceptance length / theory | step cost / theory | verify / 1 | draft per token / c "
                  "| step ms p50 | draft ms p50 | verify ms p50 | host ms p50 |"),
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            lines.append(
                f"| {r['k']} | {r['acceptance_rate'] if r['acceptance_rate'] is not None else 'real'} "
                f"| {r['output_tokens_per_s']:.1f} | {r['speedup']:.2f} | {_fmt(r.get('theory_speedup'))} "
                f"| {_yes_no(r.get('within_15pct_of_theory'))} "
                f"| {_fmt(r.get('decode_speedup'))} ({_yes_no(r.get('decode_within_15pct_of_theory'))}) "
                f"| {_fmt(r.get('prefill_step_ms_mean'), 1)} "
                f"| {_measured_predicted(r['acceptance_length'], r.get('theory_acceptance_length'))} "
                f"| {_measured_predicted(r.get('step_cost_in_plain_steps'), r.get('theory_step_cost_in_plain_steps'))} "
                f"| {_measured_predicted(r.get('verify_cost_in_plain_steps'), 1.0 if 'verify_cost_in_plain_steps' in r else None)} "
                f"| {_measured_predicted(r.get('draft_cost_per_token_in_plain_steps'), pair['cost_ratio_c'] if r['k'] else None)} "
                f"| {r['step_ms_p50']:.2f} | {r['draft_ms_p50']:.2f} | {r['verify_ms_p50']:.2f} "
                f"| {_fmt(r.get('schedule_ms_p50'))} |")
        lines.append("")
    for name, err in result.get("errors", {}).items():
        lines += [f"## {name}: failed", "", "```", err.strip().splitlines()[-1], "```", ""]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------- summary


def _rows_at(rows: list[dict], k: int) -> list[dict]:
    return [r for r in rows if r["k"] == k]


def summary_row(file: str, name: str, pair: dict) -> str:
    """One result's figures for one pair: the batch-1 steps, c, and the end-to-end headline (when measured)."""
    cells = [f"`{file}`", _pair_name(name)]
    t, d = pair.get("target_decode_step"), pair.get("draft_decode_step_batch1")
    if t:
        cells.append(f"{t['graph_ms']:.3f} ({100 * t['fraction_of_copy_bandwidth']:.0f}%)")
        b2b = t.get("graph_back_to_back_ms")
        cells.append("-" if b2b is None else f"{b2b:.3f} ({100 * t['fraction_of_copy_bandwidth_back_to_back']:.0f}%)")
        cells.append("-" if not d else f"{d['graph_ms']:.3f}")
        cells.append(_fmt(pair.get("cost_ratio_c"), 3))
    else:
        cells += ["-"] * 4
    rows = pair.get("end_to_end")
    if rows:
        add_theory(rows, pair["cost_ratio_c"])
        plain, first = _rows_at(rows, 0), _rows_at(rows, 1)
        checked = [r["within_15pct_of_theory"] for r in rows if r.get("within_15pct_of_theory") is not None]
        best = max((r for r in rows if r["k"] > 0), key=lambda r: r["speedup"], default=None)
        cells += [f"{plain[0]['baseline_tokens_per_s']:.0f}" if plain else "-",
                  _span([r["step_ms_p50"] for r in plain]), _span([r["step_ms_p50"] for r in first]),
                  (f"{_span([r['prefill_step_ms_mean'] for r in plain if 'prefill_step_ms_mean' in r], 1)} / "
                  f"{_span([r['prefill_step_ms_mean'] for r in first if 'prefill_step_ms_mean' in r], 1)}"),
                  "-" if best is None else f"{best['speedup']:.2f} (k = {best['k']}, a = {best['acceptance_rate']})",
                  f"{sum(checked)} of {len(checked)}" if checked else "-"]
    else:
        cells += ["-"] * 6
    capture = pair.get("capture")
    cells.append("-" if not capture else f"{_mb(capture['graph_capture_bytes'])} ({capture['graph_capture_s']:.1f} s)")
    return "| " + " | ".join(cells) + " |"


def render_summary(results: list[dict]) -> str:
    """One row per (result, pair), and each result's engine switches that differ from conf/engine/cuda.yaml."""
    lines = [("| file | pair | target step ms, synchronised (% of copy bw) | back to back (%) | draft step ms | c "
             "| k = 0 tokens/s | k = 0 step ms | k = 1 step ms | prompt prefill step ms, k = 0 / 1 "
             "| best speedup | within 15% of the formula | graph MiB (capture s) |"),
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for result in results:
        lines += [summary_row(result["file"], name, pair) for name, pair in result["pairs"].items()]
    defaults = engine_defaults()
    lines += ["", "Engine switches other than `conf/engine/cuda.yaml`'s:"]
    for result in results:
        off = switches_off_default(result, defaults)
        lines.append(f"- `{result['file']}`: {', '.join(off) if off else 'none'}")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------------- memory


def manager_groups(capture: dict) -> dict[str, float]:
    """MiB per manager group (MANAGER_GROUPS), `outside the managers` (the whole capture's free-memory delta less
    the managers' sum: allocations of warm-ups and of the pool outside any one graph) and `total`."""
    groups = {label: 0.0 for label, _ in MANAGER_GROUPS}
    for manager, summary in capture["managers"].items():
        label = next(label for label, prefix in MANAGER_GROUPS
                     if manager == prefix or (prefix.endswith("_") and manager.startswith(prefix)))
        groups[label] += summary["capture_bytes"] / 2**20
    total = capture["graph_capture_bytes"] / 2**20
    return {**groups, "outside the managers": total - sum(groups.values()), "total": total}


def render_memory(results: list[dict]) -> str:
    """Graph memory per manager group and capture time, one row per (result, pair) that measured the capture, with
    the batch-1 draft decode step replayed as a graph against run eagerly (the same section measures both)."""
    labels = [label for label, _ in MANAGER_GROUPS] + ["outside the managers", "total"]
    lines = ["| file | pair | " + " | ".join(f"{label} MiB" for label in labels)
             + " | capture s | draft decode step, batch 1: graph / eager ms |",
             "|---|---|" + "---|" * (len(labels) + 2)]
    for result in results:
        for name, pair in result["pairs"].items():
            if "capture" not in pair:
                continue
            groups = manager_groups(pair["capture"])
            decode = pair.get("draft_decode_step", {}).get("1")
            lines.append(f"| `{result['file']}` | {_pair_name(name)} | "
                         + " | ".join(f"{groups[label]:.0f}" for label in labels)
                         + f" | {pair['capture']['graph_capture_s']:.1f} | "
                         + ("-" if decode is None else f"{decode['graph_step_ms']:.3f} / {decode['eager_step_ms']:.2f} "
                            f"({decode['graph_speedup']:.1f}x)") + " |")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------- speedups


def speedup_columns(results: list[dict]) -> list[tuple[str, float, float, dict[int, dict]]]:
    """(pair name, synthetic acceptance rate a, c, rows by k) per (pair, rate) of every result's end-to-end runs,
    each row's speedup and formula set by add_theory."""
    columns = []
    for result in results:
        for name, pair in result["pairs"].items():
            rows = pair.get("end_to_end")
            if not rows:
                continue
            add_theory(rows, pair["cost_ratio_c"])
            for rate in sorted({r["acceptance_rate"] for r in rows if r["acceptance_rate"] is not None}):
                columns.append((name, rate, pair["cost_ratio_c"], {r["k"]: r for r in rows if r["acceptance_rate"] == rate}))
    return columns


def round_speedups(rows: dict[int, dict], k: int) -> list[float]:
    """Row k's speedup in each round: its tokens/s over k = 0's in the same round (the runs of one file alternate
    the depths round by round, so run i of every k shares round i); [] where the rows hold no runs."""
    runs, base = rows[k].get("output_tokens_per_s_runs"), (rows.get(0) or {}).get("output_tokens_per_s_runs")
    if not runs or not base or len(runs) != len(base):
        return []
    return [tokens / baseline for tokens, baseline in zip(runs, base, strict=True)]


def render_speedups(results: list[dict], tolerance: float = 0.15, realized: bool = False,
                    spread: bool = False) -> str:
    """Speedup over k = 0, measured / Leviathan's formula (`*`: more than `tolerance` from it, a fraction), one
    column per (pair, rate); under a tolerance other than 0.15, a last row counts the points within it. With
    `realized`, the formula takes each row's measured acceptance length (`leviathan.realized_speedup`) and each
    cell ends with that length over the expected one. With `spread`, each measured speedup (the median runs'
    ratio) is followed by the range of its rounds' speedups and their count (:func:`round_speedups`)."""
    columns = speedup_columns(results)
    ks = sorted({k for *_, rows in columns for k in rows if k > 0})
    labels = [f"{_pair_name(name)}, a = {rate} (c = {c:.3f})" for name, rate, c, _ in columns]
    lines = ["| k | " + " | ".join(labels) + " |", "|---|" + "---|" * len(columns)]

    def predicted(r: dict, c: float) -> float:
        return realized_speedup(r["acceptance_length"], r["k"], c) if realized else r["theory_speedup"]

    for k in ks:
        cells = []
        for _, _, c, rows in columns:
            r = rows.get(k)
            if r is None:
                cells.append("-")
                continue
            by_round = round_speedups(rows, k) if spread else []
            span = f" [{min(by_round):.2f}, {max(by_round):.2f}] (n = {len(by_round)})" if by_round else ""
            cell = (f"{r['speedup']:.2f}{span} / {predicted(r, c):.2f}"
                    f"{'' if within_tolerance(r['speedup'], predicted(r, c), tolerance) else ' *'}")
            if realized:
                cell += f" ({r['acceptance_length'] / r['theory_acceptance_length']:.2f})"
            cells.append(cell)
        lines.append(f"| {k} | " + " | ".join(cells) + " |")
    if tolerance != 0.15:  # the committed tables at 15% predate this row
        counts = [sum(within_tolerance(r["speedup"], predicted(r, c), tolerance) for k, r in rows.items() if k > 0)
                  for _, _, c, rows in columns]
        totals = [sum(1 for k in rows if k > 0) for *_, rows in columns]
        lines.append(f"| within {100 * tolerance:g}% | "
                     + " | ".join(f"{n} of {t}" for n, t in zip(counts, totals)) + " |")
    return "\n".join(lines)


def render_phases(results: list[dict]) -> str:
    """Where each end-to-end run's step goes, per k: the medians over every step of its runs of the draft phase,
    the verify and the whole step (ms), one column per (file, pair), its draft_prefill_region named (`full` for
    results written before the setting existed): the table to set runs of two settings side by side."""
    columns = [(result, name, pair["end_to_end"]) for result in results for name, pair in result["pairs"].items()
               if pair.get("end_to_end")]
    labels = [f"`{result['file']}` ({result.get('draft_prefill_region', 'full')})" for result, _, _ in columns]
    if len({name for _, name, _ in columns}) > 1:
        labels = [f"{label} {_pair_name(name)}" for label, (_, name, _) in zip(labels, columns, strict=True)]
    lines = ["| k | " + " | ".join(f"{label}: draft / verify / step ms" for label in labels) + " |",
             "|---|" + "---|" * len(columns)]
    ks = sorted({r["k"] for *_, rows in columns for r in rows})
    for k in ks:
        cells = []
        for *_, rows in columns:
            at_k = [r for r in rows if r["k"] == k]
            cells.append(" / ".join(f"{at_k[0][key]:.2f}" for key in ("draft_ms_p50", "verify_ms_p50", "step_ms_p50"))
                         if at_k else "-")
        lines.append(f"| {k} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------------- verify


def render_verify(results: list[dict]) -> str:
    """verify_cost.py results: per (file, k), each pair's verify of k + 1 tokens and draft prefill, ms and in
    plain decode steps (the k = 0 verify)."""
    names = list(dict.fromkeys(name for result in results for name in result["pairs"]))
    header = [f"{_pair_name(n)}: {part}" for n in names for part in ("verify ms (plain steps)", "draft prefill ms (plain steps)")]
    lines = ["| file | k | " + " | ".join(header) + " |", "|---|---|" + "---|" * len(header)]
    for result in results:
        ks = sorted({int(k) for pair in result["pairs"].values() for k in pair})
        for k in ks:
            cells = []
            for name in names:
                rows = result["pairs"].get(name, {})
                row, plain = rows.get(str(k)), rows.get("0")
                if row is None or plain is None:
                    cells += ["-", "-"]
                    continue
                base = plain["target_verify"]["ms"]
                for part in ("target_verify", "draft_prefill"):
                    ms = row.get(part, {}).get("ms")
                    cells.append("-" if ms is None else f"{ms:.3f} ({ms / base:.2f})")
            lines.append(f"| `{result['file']}` | {k} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def render_verify_kernels(results: list[dict], ks: set[int] | None = None, top: int = 5) -> str:
    """verify_cost.py results: per (file, pair, k >= 1; only `ks` when given), the `top` kernels whose summed time
    in one profiled verify replay changed most against the plain decode step's (k = 0), µs, and the wall times."""
    lines = ["| file | pair | k | kernel | k = 0 µs | this k µs | change µs |", "|---|---|---|---|---|---|---|"]
    for result in results:
        for name, rows in result["pairs"].items():
            for k in sorted(int(k) for k in rows if int(k) > 0 and (ks is None or int(k) in ks)):
                row, plain = rows[str(k)], rows["0"]
                growth = sorted(row.get("verify_growth_over_k0", []), key=lambda g: -abs(g["delta_us"]))[:top]
                head = f"| `{result['file']}` | {_pair_name(name)} | {k} |"
                for g in growth:
                    lines.append(f"{head} `{g['kernel'][:40]}` | {g['base_us']:.0f} | {g['us']:.0f} | "
                                 f"{g['delta_us']:+.0f} |")
                wall = (row["target_verify"]["ms"] - plain["target_verify"]["ms"]) * 1e3
                lines.append(f"{head} wall time of the replay | {plain['target_verify']['ms'] * 1e3:.0f} | "
                             f"{row['target_verify']['ms'] * 1e3:.0f} | {wall:+.0f} |")
    return "\n".join(lines)


RENDERERS = {"summary": render_summary, "memory": render_memory, "speedups": render_speedups,
             "phases": render_phases, "verify": render_verify, "verify-kernels": render_verify_kernels}


def main(argv: list[str] | None = None) -> str:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0].endswith(".json"):
        argv.insert(0, "full")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("table", choices=["full", *RENDERERS])
    parser.add_argument("results", nargs="+", help="result JSON files")
    parser.add_argument("--tolerance", type=float, default=0.15,
                        help="speedups: how far from the formula a point may lie, a fraction (default 0.15)")
    parser.add_argument("--realized", action="store_true",
                        help="speedups: the formula at each run's measured acceptance length, not the expected one")
    parser.add_argument("--spread", action="store_true",
                        help="speedups: each measured speedup's range over its rounds, and their count")
    parser.add_argument("--ks", default=None, help="verify-kernels: comma-separated depths to show (default all)")
    args = parser.parse_args(argv)
    if not 0 < args.tolerance < 1:
        parser.error(f"--tolerance {args.tolerance}: must be a fraction in (0, 1), e.g. 0.10")
    missing = [p for p in args.results if not Path(p).is_file()]
    if missing:
        parser.error(f"no such result file: {', '.join(missing)}")
    results = [load(p) for p in args.results]
    if args.table == "full":
        if len(results) != 1:
            parser.error(f"full renders one result, got {len(results)}")
        return render_full(results[0])
    if args.table == "speedups":
        return render_speedups(results, args.tolerance, args.realized, args.spread)
    if args.table == "verify-kernels":
        try:
            ks = None if args.ks is None else {int(k) for k in args.ks.split(",")}
        except ValueError:
            parser.error(f"--ks={args.ks!r}: comma-separated integers expected")
        return render_verify_kernels(results, ks)
    return RENDERERS[args.table](results)


if __name__ == "__main__":
    print(main())
