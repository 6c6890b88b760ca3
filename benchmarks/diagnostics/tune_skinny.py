"""Tune the skinny kernel's tile per weight shape on this GPU and write the table the engine reads. (GPU)

For each weight shape of the named models (or of --shapes), a CUDA graph replays the skinny kernel over every
weight of that shape at M rows of x (a verify of M = k + 1 tokens, a draft prefill region of k + 2), once per
(BLOCK_N, BLOCK_K, num_warps, num_stages) of GRID that fits the shared memory, each checked against its fp32
reference first. The targets' kernels launch in stream order and the drafts' early, as
`engine.skinny_early_launch=draft` launches them; q/k/v and the LM head take the fused norm, the o and down
projections add into a residual, and a target's gate/up stack runs `gate_up_silu` (`engine.silu_in_gate_up=target`)
where a draft's runs the skinny product, as in the engine.

A shape's tile is the one with the least time summed over the M measured; it enters the table only when that sum
beats the default rule's (:func:`specexp.models.triton_gemv.skinny_config`, `gate_up_config`) by more than
--min-gain, so a table lists only what tuning changed. The table goes to `specexp/models/kernel_configs/skinny_<device>.json`
(:mod:`specexp.models.skinny_configs`), which the engine's skinny kernels read on that GPU model.

    python benchmarks/diagnostics/tune_skinny.py --targets llama-3.2-1b --drafts llama-100m --out tune.json --write
    python benchmarks/diagnostics/tune_skinny.py --table tune.json          # per shape: default, tuned, one-row
    python benchmarks/diagnostics/tune_skinny.py --from tune.json more.json --write  # from earlier measurements
"""

from __future__ import annotations

import argparse
import ast
import itertools
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root (specexp)
sys.path.insert(0, str(Path(__file__).resolve().parent))

from specexp.models import skinny_configs, triton_gemv

SHARED_MEMORY_BYTES = 200 * 1024  # the stages' x tiles and weight chunks, under a Hopper block's 227 KiB
GRID = [c for c in itertools.product((16, 32, 64), (128, 256, 512, 1024), (4, 8), (1, 2, 3, 4))
        if (triton_gemv.TOKEN_TILE + c[0]) * c[1] * 2 * c[3] <= SHARED_MEMORY_BYTES and not (c[2] == 8 and c[0] == 16)]
# gate_up_silu's: BLOCK_N gate rows, a tile of twice as many weight rows
GATE_UP_GRID = [(c[0] // 2, *c[1:]) for c in GRID]


def check_gate_up(x: torch.Tensor, w: torch.Tensor, config: tuple[int, ...], label: str) -> None:
    """gate_up_silu(x [M, K], w [2I, K], rms_only) at `config` within 2% (of the largest output) of its fp32
    reference."""
    normed = x.float() / x.float().pow(2).mean(-1, keepdim=True).add(1e-5).sqrt()
    gate, up = torch.nn.functional.linear(normed, w.float()).chunk(2, dim=-1)
    reference = torch.nn.functional.silu(gate) * up
    got = triton_gemv.gate_up_silu(x, w, rms_only=True, eps=1e-5, config=config).float()
    if (got - reference).abs().max().item() > 2e-2 * reference.abs().max().item():
        raise AssertionError(f"{label}: gate_up_silu differs from its reference")


def gate_up_chain(weights: list[torch.Tensor], config: tuple[int, ...] | None, num_tokens: int, pdl: bool):
    """A body running gate_up_silu at `config` (None: its default) on each weight, `num_tokens` rows of x."""
    xs = [torch.randn(num_tokens, w.shape[1], device=w.device, dtype=w.dtype) for w in weights]

    def body():
        for w, x in zip(weights, xs, strict=True):
            triton_gemv.gate_up_silu(x, w, rms_only=True, eps=1e-5, config=config, pdl=pdl)

    return body


def product_kind(shape: tuple[int, int], count: int, early: bool) -> tuple[str, str]:
    """(kernel, chain) a weight [N, K] that `count` layers hold runs: a target's gate/up stack (N >= 4K) on
    gate_up_silu (`engine.silu_in_gate_up=target`), a draft's on the skinny product with the norm; o and down
    (N <= K) add into a residual; q/k/v, a conv's input projection and the LM head take the fused norm."""
    n, k = shape
    if count > 1 and n >= 4 * k:
        return ("skinny", "triton_norm") if early else ("gate_up_silu", "gate_up_silu")
    return "skinny", "triton" if count > 1 and n <= k else "triton_norm"


def measure_model(name: str, early: bool, tokens: tuple[int, ...], t0: float,
                  shapes: set[tuple[int, int]] | None = None) -> dict:
    """{str(shape): {"count", "impl", str(M): {"default", "default_ms", "one_row_gemv_ms", "all": {str(config):
    ms or None}}}} for model `name`'s products (ms: one graph replay of every weight of that shape); only `shapes`
    where given."""
    from gemv_bandwidth import MODELS, ZOO, chain, check_gemv, gemm_weights, graph_ms

    from specexp.models import load_model

    model = load_model(ZOO / MODELS[name], dtype=torch.bfloat16, device="cuda", weights="random", seed=0)
    weights = gemm_weights(model)
    out = {}
    for shape in sorted({tuple(w.shape) for w in weights} & (shapes or {tuple(w.shape) for w in weights})):
        n, k = shape
        same = [w for w in weights if tuple(w.shape) == shape]
        kernel, impl = product_kind(shape, len(same), early)
        gated = kernel == "gate_up_silu"
        row = {"count": len(same), "impl": impl, "kernel": kernel}
        for m in tokens:
            x = torch.randn(m, k, device="cuda", dtype=same[0].dtype)
            times = {}
            for config in GATE_UP_GRID if gated else GRID:
                if config[1] > max(16, triton_gemv.triton.next_power_of_2(k)):
                    continue
                try:
                    if gated:
                        check_gate_up(x, same[0], config, f"{name} {shape} {config}")
                        times[str(config)] = graph_ms(gate_up_chain(same, config, m, early))
                    else:
                        check_gemv(x, same[0], config, f"{name} {shape} {config}")
                        times[str(config)] = graph_ms(chain(same, impl, {shape: config}, m, pdl=early))
                except RuntimeError:  # out of resources on this device
                    times[str(config)] = None
            default = triton_gemv.gate_up_config(n, k) if gated else triton_gemv.skinny_config(n, k)
            if str(default) not in times:  # a rule's tile outside the grid
                times[str(default)] = graph_ms(gate_up_chain(same, default, m, early) if gated
                                               else chain(same, impl, {shape: default}, m, pdl=early))
            # the one-row GEMV of the same weights (a gate/up stack: its product alone, the SiLU left out)
            one_row = graph_ms(chain(same, "triton_norm" if impl != "triton" else "triton_gemv", None, 1,
                                     pdl=early))
            row[str(m)] = {"default": str(default), "default_ms": times.get(str(default)),
                           "one_row_gemv_ms": one_row, "all": times}
            print(f"{name} {shape} x{len(same)} M={m}: one-row {one_row:.4f} ms, default {default} "
                  f"{times.get(str(default)) or float('nan'):.4f} ms ({time.time() - t0:.0f} s)", flush=True)
        out[str(shape)] = row
    del model, weights
    torch.cuda.empty_cache()
    return out


def choose(raw: dict, min_gain: float) -> list[dict]:
    """The table's entries from a measurement: per kernel and weight shape (over every model that has it), the
    config with the least summed ms over every (model, M) measured, where it beats the default's sum by more than
    min_gain (a fraction). Each entry: kernel (gate_up_silu's only), n, k, config, and the two sums in ms."""
    sums: dict[tuple, dict] = {}
    defaults: dict[tuple, tuple] = {}
    for model in raw["models"].values():
        for shape_text, row in model.items():
            shape = (row.get("kernel", "skinny"), *ast.literal_eval(shape_text))
            for m_text, timing in row.items():
                if not m_text.isdigit():
                    continue
                defaults[shape] = ast.literal_eval(timing["default"])
                per = sums.setdefault(shape, {})
                for config_text, ms in timing["all"].items():
                    config = ast.literal_eval(config_text)
                    per[config] = None if ms is None or per.get(config, 0.0) is None else per.get(config, 0.0) + ms
    entries = []
    for shape, per in sorted(sums.items()):
        ok = {c: ms for c, ms in per.items() if ms is not None}
        default_ms = ok.get(defaults[shape])
        best = min(ok, key=ok.get)
        if default_ms is not None and ok[best] < default_ms * (1 - min_gain):
            entries.append({**({"kernel": shape[0]} if shape[0] != "skinny" else {}), "n": shape[1], "k": shape[2],
                            "config": list(best), "summed_ms": round(ok[best], 5),
                            "default_summed_ms": round(default_ms, 5)})
    return entries


def merge(raws: list[dict]) -> dict:
    """One measurement from several of one GPU model (their models' shapes together; a later file's shape replaces
    an earlier one's); ValueError when they name different devices."""
    devices = {raw["device"] for raw in raws}
    if len(devices) != 1:
        raise ValueError(f"measurements of different GPU models: {sorted(devices)}")
    merged = {**raws[0], "models": {}, "early_launch": {},
              "measured": max(raw.get("measured", "") for raw in raws),
              "tokens": sorted({t for raw in raws for t in raw.get("tokens", [])})}
    for raw in raws:
        for name, shapes in raw["models"].items():
            merged["models"].setdefault(name, {}).update(shapes)
        merged["early_launch"].update(raw.get("early_launch", {}))
    return merged


def table_markdown(raw: dict, tokens: set[int] | None = None) -> str:
    """Per (model, shape, M) (M in `tokens` where given): the one-row GEMV, the default tile and the best tile
    measured, ms per replay."""
    lines = ["| model | kernel | weight [N, K] x count | M | one-row GEMV ms | default tile ms | best tile ms (tile) |",
             "|---|---|---|---|---|---|---|"]
    for name, model in raw["models"].items():
        for shape, row in model.items():
            for m, t in ((m, t) for m, t in row.items() if m.isdigit() and (not tokens or int(m) in tokens)):
                ok = {c: ms for c, ms in t["all"].items() if ms is not None}
                best = min(ok, key=ok.get)
                lines.append(f"| {name} | {row.get('kernel', 'skinny')} | {list(ast.literal_eval(shape))} x "
                             f"{row['count']} | {m} | "
                             f"{t['one_row_gemv_ms']:.4f} | {t['default_ms']:.4f} {t['default']} | "
                             f"{ok[best]:.4f} {best} |")
    return "\n".join(lines)


def write_table(raw: dict, entries: list[dict], path: Path, min_gain: float) -> None:
    """The engine's table for raw's device (see :mod:`specexp.models.skinny_configs`)."""
    data = {"device": raw["device"], "element_bytes": 2, "measured": raw.get("measured", ""),
            "models": sorted(raw["models"]), "tokens": raw.get("tokens", []), "min_gain": min_gain,
            "configs": entries}
    skinny_configs.parse_table(data, str(path))  # what the engine will accept
    path.parent.mkdir(parents=True, exist_ok=True)
    head = json.dumps({key: value for key, value in data.items() if key != "configs"})[:-1]
    rows = ",\n  ".join(json.dumps(entry) for entry in entries)
    path.write_text(f'{head}, "configs": [\n  {rows}\n]}}\n')  # one line per shape
    print(f"wrote {path}: {len(entries)} shapes")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", default="llama-3.2-1b", help="models whose skinny kernels launch in order")
    parser.add_argument("--drafts", default="llama-100m", help="models whose skinny kernels launch early")
    parser.add_argument("--tokens", default="2,5,9", help="rows of x to tune at, comma-separated (2..16); with "
                        "--table, the rows to print (default every row measured)")
    parser.add_argument("--shapes", default="", help="only these weight shapes, NxK comma-separated (e.g. "
                        "16384x2048,4096x512; default every shape)")
    parser.add_argument("--out", help="the measurement's JSON")
    parser.add_argument("--from", dest="source", nargs="+", help="earlier measurements (one GPU model), merged")
    parser.add_argument("--table", nargs="+", help="print these measurements' tables and exit")
    parser.add_argument("--write", action="store_true", help="write the device's table into the package")
    parser.add_argument("--table-out", help="write the device's table here instead")
    parser.add_argument("--min-gain", type=float, default=0.01)
    args = parser.parse_args()
    missing = [path for path in (args.table or []) + (args.source or []) if not Path(path).is_file()]
    if missing:
        parser.exit(2, f"no such measurement file: {missing[0]}\n")
    if not 0 <= args.min_gain < 1:
        parser.exit(2, f"--min-gain {args.min_gain}: give a fraction in [0, 1), e.g. 0.01\n")
    try:
        tokens = tuple(int(t) for t in args.tokens.split(","))
        if not all(2 <= t <= triton_gemv.MAX_TOKENS for t in tokens):
            raise ValueError
    except ValueError:
        parser.exit(2, f"--tokens {args.tokens!r}: give rows between 2 and {triton_gemv.MAX_TOKENS}, e.g. 2,5,9\n")
    if args.table:
        shown = set(tokens) if args.tokens != parser.get_default("tokens") else None
        for path in args.table:
            print(f"`{Path(path).name}` ({json.loads(Path(path).read_text())['device']}):\n")
            print(table_markdown(json.loads(Path(path).read_text()), shown) + "\n")
        return
    try:
        shapes = {tuple(int(v) for v in shape.split("x", 1)) for shape in filter(None, args.shapes.split(","))}
        if any(len(shape) != 2 for shape in shapes):
            raise ValueError
    except ValueError:
        parser.exit(2, f"--shapes {args.shapes!r}: give weight shapes as NxK, comma-separated, e.g. 16384x2048\n")
    from gemv_bandwidth import MODELS

    unknown = [n for n in filter(None, f"{args.targets},{args.drafts}".split(",")) if n not in MODELS]
    if unknown and not args.source:
        parser.exit(2, f"unknown model {unknown[0]!r}: choose from {', '.join(MODELS)}\n")
    if args.source:
        try:
            raw = merge([json.loads(Path(path).read_text()) for path in args.source])
        except ValueError as exc:
            parser.exit(2, f"--from: {exc}\n")
    else:
        if not (torch.cuda.is_available() and triton_gemv.AVAILABLE):
            parser.exit(2, "tune_skinny.py measures on a CUDA GPU with Triton; none here (use --from FILE)\n")
        raw = {"device": torch.cuda.get_device_name(), "measured": time.strftime("%Y-%m-%d", time.gmtime()),
               "tokens": list(tokens), "grid": GRID, "models": {}}
        t0 = time.time()
        for names, early in ((args.targets, False), (args.drafts, True)):
            for name in filter(None, names.split(",")):
                raw["models"][name] = measure_model(name, early, tokens, t0, shapes or None)
                raw.setdefault("early_launch", {})[name] = early
                if args.out:
                    Path(args.out).write_text(json.dumps(raw, indent=1))
    if args.write or args.table_out:
        path = Path(args.table_out) if args.table_out else skinny_configs.table_path(raw["device"])
        write_table(raw, choose(raw, args.min_gain), path, args.min_gain)


if __name__ == "__main__":
    main()
