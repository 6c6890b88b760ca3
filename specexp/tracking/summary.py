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


def format_summary(record: dict) -> str:
    """A few aligned lines: status, acceptance (length and what it means, rate, per position), throughput,
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
            ("acceptance_length", f"{_fmt(m.get('acceptance_length'))}  ({acceptance_meaning(k)})"),
            ("draft_acceptance_rate", _fmt(m.get("draft_acceptance_rate"))),
            ("per_position_acceptance", per_pos),
        ]
        hist = m.get("num_speculative_tokens_hist") or []
        if sum(1 for n in hist if n) > 1:  # a dynamic depth: how many steps ran each k
            rows.append(("steps per k (num_speculative_tokens_hist)",
                         " ".join(f"k={j}:{n}" for j, n in enumerate(hist) if n)))
        rows += [
            ("requests / output tokens", f"{m.get('num_requests')} / {m.get('num_output_tokens')}"),
            ("output_tokens_per_s", _fmt(m.get("output_tokens_per_s"), ".1f")),
        ]
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
