"""The compact summary printed at the end of a run: what was measured, what it means, where it went."""

from __future__ import annotations

from pathlib import Path

from specexp.startup import format_startup


def _fmt(value, spec: str = ".2f") -> str:
    if value is None:
        return "-"
    return format(value, spec) if isinstance(value, float) else str(value)


def _fmt_bytes(value) -> str:
    return "-" if value is None else f"{value / 2**20:.1f} MiB"


def acceptance_meaning(k: int | None) -> str:
    """One line saying what acceptance_length is, with the range it takes at depth ``k``."""
    if not k:
        return "no speculation (k = 0): every step emits one token"
    return (f"tokens emitted per target verification, accepted drafts + 1: 1 = no draft accepted, "
            f"{k + 1} = all {k}")


def wandb_location(record: dict) -> str:
    """Where the run's W&B record went: the offline run directory (and how to upload it), the online URL,
    or why there is none."""
    wandb = record.get("wandb") or {}
    mode = wandb.get("mode", "disabled")
    if mode == "disabled":
        return "off (tracking=disabled)"
    if mode == "failed":
        return "not logged (see the warning above); the run record is complete"
    if mode == "online" and wandb.get("url"):
        return wandb["url"]
    run_dir = wandb.get("dir")
    if run_dir is None and record.get("run_dir"):
        found = sorted((Path(record["run_dir"]) / "wandb").glob("offline-run-*"))
        run_dir = str(found[-1]) if found else None
    if run_dir is None:
        return mode
    return f"{mode}: {run_dir} (upload later: wandb sync {run_dir})" if mode == "offline" else f"{mode}: {run_dir}"


def _on_cuda(record: dict) -> bool:
    device = (record.get("env") or {}).get("device") or ((record.get("config") or {}).get("engine") or {}).get("device")
    return str(device).startswith("cuda")


def _interval(low, high, spec: str = ".2f") -> str:
    return f"[{_fmt(low, spec)}, {_fmt(high, spec)}]" if low is not None and high is not None else "[no interval]"


def acceptance_text(m: dict) -> str:
    """``2.51 [2.31, 2.70] 95% over 8 requests``: acceptance length with its bootstrap interval."""
    boot = (m.get("intervals") or {}).get("acceptance") or {}
    bounds = boot.get("acceptance_length") or {}
    if not boot:
        return _fmt(m.get("acceptance_length"))
    if not m.get("num_drafts"):
        return f"{_fmt(m.get('acceptance_length'))} (exact: no drafts)"
    if not boot.get("num_requests"):  # whole-run counters only (vLLM): nothing to resample
        return f"{_fmt(m.get('acceptance_length'))} (no interval: {boot.get('note') or 'no per-request counts'})"
    return (f"{_fmt(m.get('acceptance_length'))} {_interval(bounds.get('low'), bounds.get('high'))} 95% bootstrap"
            f" over {boot.get('num_requests')} requests")


def spread_text(m: dict, name: str, spec: str = ".1f") -> str:
    """``188.7 ± 3.2 (mean ± std of 3 repeats; 95% CI [180.1, 197.3])`` for a figure of ``metrics.intervals``;
    the value alone with "1 repeat: no interval"; a trailing "noisy" when the record marks it."""
    from specexp.measure.guards import is_marked

    summary = (m.get("intervals") or {}).get(name) or {}
    noisy = "  NOISY (see warnings)" if is_marked(m.get("noise"), name) else ""
    if not summary:
        return _fmt(m.get(name), spec) + noisy
    if summary.get("std") is None:
        return f"{_fmt(summary.get('mean'), spec)}  (1 repeat: no interval){noisy}"
    return (f"{_fmt(summary['mean'], spec)} ± {_fmt(summary['std'], spec)}  (mean ± std of {summary['n']} repeats;"
            f" 95% CI {_interval(summary['low'], summary['high'], spec)}){noisy}")


def format_summary(record: dict) -> str:
    """A few aligned lines: status, acceptance (length with its bootstrap interval and what it means, rate, per
    position), throughput (mean ± std over the repeats, with its interval), how it was measured,
    TTFT/TPOT/e2e and queueing, the backend's end-of-request rule, graph memory (CUDA runs only), and where
    the W&B run went. ``record`` is the result.json dict."""
    m = record.get("metrics") or {}
    per_pos = " ".join(_fmt(p) for p in m.get("per_position_acceptance") or []) or "-"
    rows = [
        ("status", record["status"] + (f" ({record['error']})" if record.get("error") else "")),
        ("run dir", record.get("run_dir", "-")),
    ]
    if m:
        k = m.get("num_speculative_tokens")
        rows += [
            ("k (num_speculative_tokens)", _fmt(k)),
            ("acceptance_length", f"{acceptance_text(m)}  ({acceptance_meaning(k)})"),
            ("draft_acceptance_rate", _fmt(m.get("draft_acceptance_rate"))),
            ("per_position_acceptance", per_pos),
        ]
        hist = m.get("num_speculative_tokens_hist") or []
        if sum(1 for n in hist if n) > 1:  # a dynamic depth: how many steps ran each k
            rows.append(("steps per k (num_speculative_tokens_hist)",
                         " ".join(f"k={j}:{n}" for j, n in enumerate(hist) if n)))
        rows += [
            ("requests / output tokens", f"{m.get('num_requests')} / {m.get('num_output_tokens')}"),
            ("output_tokens_per_s", spread_text(m, "output_tokens_per_s")),
        ]
        measure = record.get("measure") or {}
        if measure:
            order = str(measure.get("order", "")).replace("_", " ")
            repeats, warmups = measure.get("repeats"), measure.get("warmup_requests")
            text = (f"{repeats} repeat{'s' * (repeats != 1)} ({order}), {warmups} warm-up"
                    f" request{'s' * (warmups != 1)}; latencies below are means over the repeats")
            rows.append(("measured", text))
        # Every backend counts latencies from the request's arrival; queue_ms (arrival -> first scheduled)
        # is the part of ttft_ms spent waiting for a batch slot.
        labels = {"ttft_ms": "ttft_ms from arrival", "queue_ms": "queue_ms (part of ttft)"}
        for key in ("ttft_ms", "queue_ms", "tpot_ms", "e2e_ms"):
            d = m.get(key) or {}
            rows.append((f"{labels.get(key, key)} mean/p50/p99",
                         " / ".join(_fmt(d.get(s)) for s in ("mean", "p50", "p99"))))
        if m.get("end_of_request_rule"):
            rows.append(("end-of-request rule", m["end_of_request_rule"]))
        if m.get("startup_s"):
            rows.append(("startup_s", format_startup(m["startup_s"])))
        if _on_cuda(record):
            capture = f"{_fmt_bytes(m.get('graph_capture_bytes'))} / {_fmt(m.get('graph_capture_s'))}"
            rows.append(("graph_capture_bytes / _s", capture))
            if m.get("persistent_buffer_bytes") is not None:
                rows.append(("persistent_buffer_bytes", _fmt_bytes(m["persistent_buffer_bytes"])))
    rows.append(("W&B", wandb_location(record)))
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"  {name:<{width}}  {value}" for name, value in rows)


def job_line(record: dict) -> str:
    """One line of a sweep's closing table: acceptance length with its interval and tokens/s mean ± std over
    the repeats, e.g. ``k=4: acceptance 2.51 [2.31, 2.70] (8 requests); 188.7 ± 3.2 tokens/s (3 repeats)``."""
    m = record.get("metrics") or {}
    k = m.get("num_speculative_tokens")
    boot = ((m.get("intervals") or {}).get("acceptance") or {}).get("acceptance_length") or {}
    if not m.get("num_drafts"):
        accept = f"{_fmt(m.get('acceptance_length'))} (exact: no drafts)"
    else:
        accept = (f"{_fmt(m.get('acceptance_length'))} {_interval(boot.get('low'), boot.get('high'))}"
                  f" ({m.get('num_requests')} requests)")
    speed = (m.get("intervals") or {}).get("output_tokens_per_s") or {}
    if speed.get("std") is not None:
        tokens = f"{_fmt(speed['mean'], '.1f')} ± {_fmt(speed['std'], '.1f')} tokens/s ({speed['n']} repeats)"
    else:
        tokens = f"{_fmt(m.get('output_tokens_per_s'), '.1f')} tokens/s (1 repeat: no spread)"
    from specexp.measure.guards import is_marked

    noisy = ", noisy" if is_marked(m.get("noise"), "output_tokens_per_s") else ""
    return f"k={k}: acceptance {accept}; {tokens}{noisy}"
