"""The compact summary table printed at the end of a run."""

from __future__ import annotations


def _fmt(value, spec: str = ".2f") -> str:
    if value is None:
        return "-"
    return format(value, spec) if isinstance(value, float) else str(value)


def _fmt_bytes(value) -> str:
    return "-" if value is None else f"{value / 2**20:.1f} MiB"


def format_summary(record: dict) -> str:
    """A few aligned lines: status, acceptance (length, rate, per position), throughput, TTFT/TPOT/e2e,
    graph memory. ``record`` is the result.json dict."""
    m = record.get("metrics") or {}
    per_pos = " ".join(_fmt(p) for p in m.get("per_position_acceptance") or []) or "-"
    rows = [
        ("status", record["status"] + (f" ({record['error']})" if record.get("error") else "")),
        ("run dir", record.get("run_dir", "-")),
    ]
    if m:
        rows += [
            ("k (num_speculative_tokens)", _fmt(m.get("num_speculative_tokens"))),
            ("acceptance_length", _fmt(m.get("acceptance_length"))),
            ("draft_acceptance_rate", _fmt(m.get("draft_acceptance_rate"))),
            ("per_position_acceptance", per_pos),
            ("requests / output tokens", f"{m.get('num_requests')} / {m.get('num_output_tokens')}"),
            ("output_tokens_per_s", _fmt(m.get("output_tokens_per_s"), ".1f")),
        ]
        for key in ("ttft_ms", "tpot_ms", "e2e_ms"):
            d = m.get(key) or {}
            rows.append((f"{key} mean / p50 / p99", " / ".join(_fmt(d.get(s)) for s in ("mean", "p50", "p99"))))
        rows.append(("graph_capture_bytes", _fmt_bytes(m.get("graph_capture_bytes"))))
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"  {name:<{width}}  {value}" for name, value in rows)
