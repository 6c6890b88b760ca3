"""One W&B run per specexp run: the window onto results, never required for a run to finish.

Modes (``tracking.wandb.mode``): ``offline`` (default; files under ``<run_dir>/wandb``, no network ever),
``online`` (falls back to offline with one warning line when there is no API key or W&B cannot be
reached), ``disabled``. The mode is always passed to ``wandb.init`` explicitly. wandb cannot read offline
runs back, so analysis reads ``result.json``/``steps.parquet``; ``wandb sync <run_dir>/wandb/offline-run-*``
uploads an offline run later.

Everything a run's W&B record needs stays inside the run directory, so a copied run folder keeps it: wandb
stages artifact files (result.json) under ``$WANDB_DATA_DIR/artifacts/staging``, by default in the user's
home (``~/.local/share/wandb``); while a run is logged ``WANDB_DATA_DIR`` is ``<run_dir>/wandb`` (wandb has
no setting for it). The W&B run's id, directory and URL are written into result.json's ``wandb`` section.
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

from specexp.tracking import records

MODES = ("offline", "online", "disabled")
ONLINE_INIT_TIMEOUT_S = 20.0


def flatten(tree: dict, prefix: str = "") -> dict:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``; lists and scalars are leaves."""
    flat = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = value
    return flat


def _warn(message: str) -> None:
    print(f"specexp: warning: {message}", file=sys.stderr)


def _init(wandb, mode: str, run_dir: Path, options: dict):
    settings = wandb.Settings(
        silent=True,
        console="off",
        x_disable_stats=True,
        disable_git=True,
        save_code=False,
        init_timeout=ONLINE_INIT_TIMEOUT_S,
    )
    return wandb.init(mode=mode, dir=str(run_dir), settings=settings, reinit="create_new", **options)


@contextlib.contextmanager
def staged_in(directory: Path):
    """Within this block wandb stages artifact files under ``directory/artifacts/staging``."""
    previous = os.environ.get("WANDB_DATA_DIR")
    os.environ["WANDB_DATA_DIR"] = str(directory)
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("WANDB_DATA_DIR", None)
        else:
            os.environ["WANDB_DATA_DIR"] = previous


def _has_api_key() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    netrc = Path(os.environ.get("NETRC", Path.home() / ".netrc"))
    return netrc.is_file() and "api.wandb.ai" in netrc.read_text(errors="ignore")


def log_run(record: dict, run_dir: Path, mode: str, options: dict) -> str:
    """Log ``record`` (the result.json dict) as one W&B run in ``run_dir``; returns the mode actually used.

    ``options``: ``wandb.init`` keywords (project, entity, group, job_type, name, tags). Logged: the
    resolved config (flattened), every scalar metric as summary (the intervals' bounds included, and the noise
    flags as ``noise.flags``), per-position acceptance with its bootstrap interval, the acceptance histograms
    (run, per request and by draft length), the steps and acceptance length per step depth k, the repeats and
    the intervals over them, and the per-category / per-task metrics as tables,
    result.json as an artifact (staged inside ``run_dir``). ``record["wandb"]`` gains ``mode`` (the one
    used), ``run_id``, ``dir`` (the W&B run's directory) and ``url`` (online runs), and result.json is
    rewritten with them before it is logged.
    """
    if mode == "disabled":
        return mode
    os.environ.setdefault("WANDB_SILENT", "true")
    import wandb

    with staged_in(Path(run_dir) / "wandb"):
        return _log(wandb, record, Path(run_dir), mode, options)


def _log(wandb, record: dict, run_dir: Path, mode: str, options: dict) -> str:
    options = {**options, "config": flatten(record.get("config") or {})}
    if mode == "online" and not _has_api_key():
        _warn("tracking.wandb.mode=online but no W&B API key is configured: logging offline instead")
        mode = "offline"
    try:
        run = _init(wandb, mode, run_dir, options)
    except Exception as e:
        if mode != "online":
            raise
        _warn(f"W&B online init failed ({type(e).__name__}): logging offline instead")
        mode = "offline"
        run = _init(wandb, mode, run_dir, options)
    try:
        location = {"mode": mode, "run_id": run.id, "dir": str(Path(run.dir).parent),
                    "url": run.url if mode == "online" else None}
        record["wandb"] = {**(record.get("wandb") or {}), **location}
        if (run_dir / records.RESULT_FILE).is_file():
            records.write_result(run_dir, record)
        metrics = record.get("metrics") or {}
        run.summary.update({"status": record["status"], "error": record.get("error")})
        run.summary.update({k: v for k, v in flatten(metrics).items() if isinstance(v, (int, float)) or v is None})
        run.summary.update({"noise.flags": ", ".join((metrics.get("noise") or {}).get("flags") or []) or "none"})
        for name, table in {**_tables(wandb, metrics), **_repeat_tables(wandb, record)}.items():
            run.log({name: table})
        artifact = wandb.Artifact(name=f"result-{run.id}", type="run-record")
        artifact.add_file(str(run_dir / "result.json"))
        run.log_artifact(artifact)
    finally:
        run.finish()
    return mode


def _tables(wandb, metrics: dict) -> dict:
    tables = {}
    accepted = metrics.get("accepted_per_position") or []
    if accepted:
        boot = (metrics.get("intervals") or {}).get("acceptance") or {}

        def bound(name: str, side: str, i: int):
            values = (boot.get(name) or {}).get(side) or []
            return values[i] if i < len(values) else None

        rows = [
            [i, accepted[i], metrics["drafted_per_position"][i], metrics["per_position_acceptance"][i],
             bound("per_position_acceptance", "low", i), bound("per_position_acceptance", "high", i),
             metrics["conditional_acceptance"][i], bound("conditional_acceptance", "low", i),
             bound("conditional_acceptance", "high", i)]
            for i in range(len(accepted))
        ]
        tables["per_position_acceptance"] = wandb.Table(
            columns=["position", "accepted", "drafted", "per_position_acceptance", "per_position_low",
                     "per_position_high", "conditional_acceptance", "conditional_low", "conditional_high"],
            data=rows,
        )
    if metrics.get("num_drafts"):
        tables["acceptance_histogram"] = wandb.Table(
            columns=["num_accepted", "drafts"], data=[[j, n] for j, n in enumerate(metrics["acceptance_histogram"])]
        )
        per_request = metrics.get("acceptance_histogram_per_request") or {}
        tables["acceptance_histogram_per_request"] = wandb.Table(
            columns=["request_id", "num_accepted", "drafts"],
            data=[[rid, j, n] for rid, hist in per_request.items() for j, n in enumerate(hist)],
        )
        by_length = metrics.get("acceptance_histogram_by_draft_length") or []
        tables["acceptance_histogram_by_draft_length"] = wandb.Table(
            columns=["num_draft_tokens", "num_accepted", "drafts"],
            data=[[d, j, n] for d, hist in enumerate(by_length) for j, n in enumerate(hist) if d > 0],
        )
    hist = metrics.get("num_speculative_tokens_hist")
    if hist:
        lengths = metrics.get("acceptance_length_by_num_speculative_tokens") or [None] * len(hist)
        tables["num_speculative_tokens_hist"] = wandb.Table(
            columns=["num_speculative_tokens", "steps", "acceptance_length"],
            data=[[k, n, lengths[k]] for k, n in enumerate(hist)],
        )
    for level in ("by_category", "by_task"):
        groups = metrics.get(level) or {}
        if groups:
            tables[level] = wandb.Table(columns=[level.removeprefix("by_"), *GROUP_TABLE_COLUMNS],
                                        data=[[name, *group_row(m)] for name, m in groups.items()])
    return tables


REPEAT_COLUMNS = ("repeat", "sweep_slot", "started_at", "output_tokens_per_s", "ttft_ms_p50", "tpot_ms_p50",
                  "e2e_ms_mean", "acceptance_length", "wall_s", "process_cpu_s", "load_1min_after")


def _repeat_tables(wandb, record: dict) -> dict:
    """``repeats``: one row per measured repeat (its figures, slot, times, load after it), and
    ``intervals``: each figure's mean, std, 95% interval and n over the repeats, so a W&B chart can draw
    error bars."""
    repeats = record.get("repeats") or []
    if not repeats:
        return {}
    rows = []
    for r in repeats:
        figures, after = r.get("figures") or {}, (r.get("machine") or {}).get("after") or {}
        rows.append([r.get("repeat"), r.get("sweep_slot"), r.get("started_at"), figures.get("output_tokens_per_s"),
                     (figures.get("ttft_ms") or {}).get("p50"), (figures.get("tpot_ms") or {}).get("p50"),
                     (figures.get("e2e_ms") or {}).get("mean"), figures.get("acceptance_length"), r.get("wall_s"),
                     r.get("process_cpu_s"), (after.get("load_avg") or [None])[0]])
    intervals = (record.get("metrics") or {}).get("intervals") or {}
    flat = flatten({k: v for k, v in intervals.items() if k != "acceptance"})
    figures = [name.removesuffix(".mean") for name in flat if name.endswith(".mean")]
    summary = [[f, *(flat.get(f"{f}.{stat}") for stat in ("mean", "std", "low", "high", "n"))] for f in figures]
    return {"repeats": wandb.Table(columns=list(REPEAT_COLUMNS), data=rows),
            "intervals": wandb.Table(columns=["figure", "mean", "std", "low", "high", "n"], data=summary)}


# Columns of the by_category / by_task tables (specexp.group_metrics): name -> how to read it from a group.
GROUP_TABLE_COLUMNS = ("num_requests", "num_output_tokens", "acceptance_length", "draft_acceptance_rate",
                       "spec_bench_mean_accepted_tokens", "output_tokens_per_s", "ttft_ms_p50", "ttft_ms_p99",
                       "tpot_ms_p50", "tpot_ms_p99", "per_position_acceptance", "acceptance_histogram")


def group_row(group: dict) -> list:
    """One by_category / by_task table row of :data:`GROUP_TABLE_COLUMNS` (lists as text, so W&B keeps them)."""
    row = []
    for column in GROUP_TABLE_COLUMNS:
        if column.startswith(("ttft_ms_", "tpot_ms_")):
            key, stat = column.rsplit("_", 1)
            row.append((group.get(key) or {}).get(stat))
        elif isinstance(group.get(column), list):
            row.append(" ".join("-" if v is None else f"{v:.3g}" for v in group[column]))
        else:
            row.append(group.get(column))
    return row
