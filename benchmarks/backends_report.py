"""Render benchmarks/backends_gpu.py's JSON files as the markdown tables of an experiments/ report.

    python benchmarks/backends_report.py FILE.json [FILE.json ...] > tables.md

Points are keyed by name; a later file's point replaces an earlier one of the same name (list the files
oldest first). Each table row says which file its figures come from. Outputs are compared token by token
with the target's greedy output: the native k = 0 output of the same pair in the same files.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

BACKENDS = ("native", "hf", "vllm")


def load(paths: list[str]) -> tuple[dict[str, dict], dict[str, dict]]:
    """(points by name, machine by file name); each point gains `source` (its file's name)."""
    points, machines = {}, {}
    for path in paths:
        data = json.loads(Path(path).read_text())
        machines[Path(path).name] = data.get("machine", {})
        for point in data["points"]:
            points[point["name"]] = {**point, "source": Path(path).name}
    return points, machines


def _fmt(value, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


def _mib(num_bytes) -> str:
    return "-" if num_bytes is None else f"{num_bytes / 2**20:.1f}"


def first_divergence(outputs: dict, reference: dict) -> list[tuple[str, int]]:
    """(prompt id, first differing index) of every prompt whose tokens differ from the reference's."""
    diffs = []
    for prompt_id, tokens in outputs.items():
        ref = reference.get(prompt_id)
        if ref is None or tokens == ref:
            continue
        index = next((i for i, (a, b) in enumerate(zip(tokens, ref)) if a != b), min(len(tokens), len(ref)))
        diffs.append((prompt_id, index))
    return diffs


def _by(points: dict, pair: str, backend: str) -> dict[int, dict]:
    return {p["k"]: p for p in points.values() if p["pair"] == pair and p["backend"] == backend
            and p["status"] == "ok" and (backend != "vllm" or p["graphs"] or p["k"] > 0)}


def token_accounting(point: dict) -> str:
    """`first + drafts + accepted = counted` vs the output tokens: a backend that counts drafts verified
    past max_tokens counts more tokens than it outputs."""
    if not point.get("num_drafts"):
        return "-"
    num_requests = len(point.get("outputs") or {})
    accepted = round((point["acceptance_length"] - 1) * point["num_drafts"])
    counted = num_requests + point["num_drafts"] + accepted
    return f"{num_requests} + {point['num_drafts']} + {accepted} = {counted} (out {point['num_output_tokens']})"


def pair_tables(points: dict, pair: str) -> list[str]:
    rows = {b: _by(points, pair, b) for b in BACKENDS}
    ks = sorted({k for r in rows.values() for k in r})
    if not ks:
        return []
    reference = (rows["native"].get(0) or {}).get("outputs")
    lines = [f"### {pair}", "",
             "| k | AL native | AL hf | AL vllm | tok/s native | tok/s hf | tok/s vllm | TPOT p50 ms native / hf / vllm "
             "| graph MiB native / vllm | outputs != target greedy (native / hf / vllm) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for k in ks:
        cells = {b: rows[b].get(k) for b in BACKENDS}

        def get(backend, key, spec=".2f", cells=cells):
            return _fmt((cells[backend] or {}).get(key), spec)

        diff = []
        for b in BACKENDS:
            if cells[b] is None or reference is None:
                diff.append("-")
            else:
                d = first_divergence(cells[b]["outputs"], reference)
                diff.append(f"{len(d)}/{len(cells[b]['outputs'])}" + (f" (at token {d[0][1]})" if d else ""))
        lines.append(
            f"| {k} | {get('native', 'acceptance_length', '.3f')} | {get('hf', 'acceptance_length', '.3f')} "
            f"| {get('vllm', 'acceptance_length', '.3f')} | {get('native', 'output_tokens_per_s', '.1f')} "
            f"| {get('hf', 'output_tokens_per_s', '.1f')} | {get('vllm', 'output_tokens_per_s', '.1f')} "
            f"| {get('native', 'tpot_ms_p50')} / {get('hf', 'tpot_ms_p50')} / {get('vllm', 'tpot_ms_p50')} "
            f"| {_mib((cells['native'] or {}).get('graph_capture_bytes'))} / "
            f"{_mib((cells['vllm'] or {}).get('graph_capture_bytes'))} | {' / '.join(diff)} |")
    sources = sorted({p["source"] for r in rows.values() for p in r.values()})
    lines += ["", f"Sources: {', '.join(f'`{s}`' for s in sources)}.", ""]
    both = [k for k in ks if k > 0 and k in rows["native"] and k in rows["vllm"]]
    if both:
        lines += ["Per-position acceptance and token accounting (requests + drafts + accepted = tokens counted, vs "
                  "output tokens):", "", "| k | backend | per-position acceptance | drafts | accounting |",
                  "|---|---|---|---|---|"]
        for k in both:
            for b in ("native", "vllm"):
                p = rows[b][k]
                per_pos = " ".join(f"{x:.3f}" for x in p.get("per_position_acceptance") or [])
                lines.append(f"| {k} | {b} | {per_pos} | {p.get('num_drafts')} | {token_accounting(p)} |")
        lines.append("")
    return lines


def failure_table(points: dict) -> list[str]:
    failed = [p for p in points.values() if p["status"] != "ok"]
    if not failed:
        return []
    lines = ["| pair | backend | k | CUDA graphs | status | message |", "|---|---|---|---|---|---|"]
    for p in sorted(failed, key=lambda p: (p["pair"], p["backend"], p["k"], not p["graphs"])):
        message = (p.get("error") or "").replace("|", "\\|")
        lines.append(f"| {p['pair']} | {p['backend']} | {p['k']} | {'yes' if p['graphs'] else 'no'} | {p['status']} "
                     f"| `{message}` |")
    return lines + [""]


def render(paths: list[str]) -> str:
    points, machines = load(paths)
    lines = []
    for name, m in machines.items():
        lines.append(f"- `{name}`: {m.get('gpu', 'CPU')}, torch {m.get('torch')}, Python {m.get('python')}, "
                     f"vLLM {m.get('vllm')}, {m.get('cpu_count')} CPUs")
    lines.append("")
    for pair in sorted({p["pair"] for p in points.values()}):
        lines += pair_tables(points, pair)
    lines += failure_table(points)
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: backends_report.py FILE.json [FILE.json ...]")
    print(render(sys.argv[1:]))
