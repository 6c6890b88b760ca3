"""Run records -> one tidy pandas row per run.

The local run record (``result.json`` in each run directory, docs/design.md §5) is the source of truth: every
run writes it, whatever its W&B mode, and wandb cannot read *offline* runs back. W&B is an optional second
source for runs logged online (:mod:`specexp.analysis.wandb_source`).

Columns of :func:`load_runs` (one row per run):

- record fields: ``status``, ``error``, ``experiment``, ``run_dir``, ``started_at``, ``run_duration_s``
  (whole run incl. model loading), ``sweep_group`` (the W&B group = the sweep directory's name; ``None``
  for a single run), ``job_num`` (the job's subdirectory number in a sweep);
- the resolved config flattened with dots: ``pair.name``, ``speculator.num_speculative_tokens``,
  ``workload.name``, ``backend.name``, ``engine.max_num_seqs``, ...; ``k`` is a short alias of
  ``speculator.num_speculative_tokens``;
- the §4 metrics flattened the same way: ``acceptance_length``, ``output_tokens_per_s``, ``tpot_ms.p50``,
  ``draft_ms.mean``, ...; list-valued metrics (``per_position_acceptance``, ``acceptance_histogram``) stay
  lists in their cell and dict-valued ones whose keys are data (``acceptance_histogram_per_request``,
  ``graph_capture_per_size``, and the per-group ``by_category`` / ``by_task`` of :mod:`specexp.analysis.tasks`)
  stay dicts;
- ``env.*``: where the run ran (``env.device``, ``env.gpu``, ``env.git_sha``, ...);
- ``steps.*``: decode-step timings summarised from ``steps.parquet`` when it exists (see
  :func:`decode_step_summary`); absent for runs loaded from W&B. With several repeats,
  ``steps.by_repeat.decode_verify_ms``, ``steps.by_repeat.draft_ms_per_forward`` and ``steps.by_repeat.num_reqs_mean``
  (the mean batch over all of the repeat's steps) hold one value per repeat;
- the measurement (docs/design.md §4, "Repeats and intervals"): ``num_repeats``, the intervals
  ``intervals.<figure>.{mean,std,low,high,n}`` (over repeats) and ``intervals.acceptance.*`` (bootstrap over
  requests), ``sample_counts.*``, ``noise.flags`` / ``noise.figures`` / ``noise.warnings`` (lists),
  ``repeats.<figure>`` (the per-repeat values of :data:`REPEAT_FIGURES`, a list), ``repeats.by_task`` and
  ``repeats.by_category`` (``{group: {figure: [one value per repeat]}}``, the per-group timing figures each
  repeat kept; ``{}`` for records without them), ``measurement.order``, ``measurement.engine_builds``,
  ``measurement.warmup_requests``, ``measurement.load_avg_1m`` (the 1-minute load averages read before the
  first repeat and after each one, a list), ``measurement.cpu_count`` and ``measurement.repeat_times`` (each
  repeat's start, ISO time, and ``measurement.repeat_wall_s`` its wall seconds, lists). A record written before repeats
  existed reads as one repeat with no intervals.
"""

from __future__ import annotations

import glob
import json
import math
import os
import re
import warnings
from collections.abc import Iterable
from pathlib import Path

import pandas as pd

RESULT_FILE = "result.json"
STEPS_FILE = "steps.parquet"
DEFAULT_RUNS_DIR = "experiments/runs"
K_COLUMN = "speculator.num_speculative_tokens"
# Metric values that are dicts keyed by data (request ids, graph sizes), kept whole instead of flattened.
NESTED_METRICS = ("acceptance_histogram_per_request", "drafted_per_position_per_request", "graph_capture_per_size",
                  "by_category", "by_task", "adaptive_step_costs")
# Per-repeat figures (result.json's ``repeats``) kept as one list per run: ``repeats.<figure>``.
REPEAT_FIGURES = ("output_tokens_per_s", "tpot_ms.p50", "ttft_ms.p50", "e2e_ms.mean", "acceptance_length")
GROUP_LEVELS = ("by_task", "by_category")  # per-group figures a repeat may keep: ``repeats.by_task`` ...
STEP_PHASES = ("schedule_ms", "draft_ms", "verify_ms", "sample_ms")
RECORD_COLUMNS = (
    "status", "error", "experiment", "run_dir", "started_at", "run_duration_s", "sweep_group", "job_num",
)


def flatten(tree: dict, prefix: str = "", keep: Iterable[str] = ()) -> dict:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``. Lists, scalars, empty dicts and keys named in ``keep`` are
    leaves."""
    flat = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value and key not in keep:
            flat.update(flatten(value, f"{name}.", keep))
        else:
            flat[name] = value
    return flat


def find_project_root(start: Path | None = None) -> Path | None:
    """The nearest directory at or above ``start`` (default: the working directory) holding specexp's
    ``pyproject.toml``; ``None`` outside a checkout."""
    here = Path(start or Path.cwd()).resolve()
    for candidate in (here, *here.parents):
        if (candidate / "pyproject.toml").is_file() and (candidate / "specexp").is_dir():
            return candidate
    return None


def runs_dir() -> Path:
    """Where runs live: ``$SPECEXP_RUNS_DIR`` or ``experiments/runs``. A relative path is taken from the
    working directory if it exists there, else from the project root (so a notebook started in
    ``notebooks/`` finds the runs that ``python -m specexp run`` wrote from the root)."""
    path = Path(os.environ.get("SPECEXP_RUNS_DIR") or DEFAULT_RUNS_DIR).expanduser()
    if path.is_absolute() or path.exists():
        return path.resolve()
    root = find_project_root()
    return (root / path).resolve() if root else path.resolve()


GLOB_CHARS = re.compile(r"[*?\[]")
SKIPPED_DIRS = ("wandb", ".hydra", "__pycache__", ".git")


def expand_paths(paths: str | Path | Iterable[str | Path]) -> tuple[list[Path], list[str]]:
    """(paths, unmatched): each of ``paths`` as given, or the sorted matches of a glob pattern
    (``experiments/runs/depth_sweep_*``, ``**`` allowed); ``unmatched`` lists the paths that do not exist and
    the patterns that match nothing."""
    if isinstance(paths, (str, Path)):
        paths = [paths]
    found, unmatched = [], []
    for path in paths:
        text = os.path.expanduser(str(path))
        if Path(text).exists():
            found.append(Path(text))
        elif GLOB_CHARS.search(text) and (matches := sorted(glob.glob(text, recursive=True))):
            found.extend(map(Path, matches))
        else:
            unmatched.append(str(path))
    return found, unmatched


def _walk_result_files(root: Path):
    """Every result.json at or under ``root``, following symlinked directories (each real directory is
    visited once, so a link cycle ends) and skipping W&B and Hydra folders."""
    seen: set[str] = set()
    for here, dirs, files in os.walk(root, followlinks=True):
        real = os.path.realpath(here)
        if real in seen:
            dirs[:] = []
            continue
        seen.add(real)
        dirs[:] = sorted(d for d in dirs if d not in SKIPPED_DIRS)
        if RESULT_FILE in files:
            yield Path(here) / RESULT_FILE


def find_run_dirs(paths: str | Path | Iterable[str | Path]) -> list[Path]:
    """Run directories (those holding a result.json) at or under each of ``paths``, sorted, without
    duplicates. A path may be a runs directory, a sweep directory, a run directory, a result.json, a
    symlink to any of these, or a glob pattern; symlinked directories inside them are followed. Paths that
    do not exist are ignored (:func:`expand_paths` lists them). Returned paths are resolved (a run reached
    through a link is its real directory)."""
    found: set[Path] = set()
    for path in expand_paths(paths)[0]:
        if path.is_file() and path.name == RESULT_FILE:
            found.add(path.parent.resolve())
        elif path.is_dir():
            found.update(p.parent.resolve() for p in _walk_result_files(path))
    return sorted(found)


def _sweep_group(record: dict, run_dir: Path) -> str | None:
    group = (record.get("wandb") or {}).get("group")
    if group:
        return group
    parent = run_dir.parent
    if (parent / "multirun.yaml").is_file() or (run_dir.name.isdigit() and (run_dir / ".hydra").is_dir()):
        return parent.name
    return None


def decode_step_summary(steps: pd.DataFrame, k: int) -> dict:
    """Mean per-step timings over the run's *decode* steps (prefill steps excluded), from steps.parquet.

    A decode step is one where every request contributed exactly its last token plus its drafts:
    ``num_tokens == num_reqs + num_draft_tokens``. Returns ``steps.decode_steps`` (how many),
    ``steps.decode_<phase>`` (mean ms per decode step for schedule/draft/verify/sample/step) and
    ``steps.draft_ms_per_forward``: mean ``draft_ms / k`` over decode steps where every request carried
    all ``k`` drafts (``num_draft_tokens == num_reqs * k``) — one draft step drafts one token per request,
    so a full-depth step runs ``k`` draft forwards (``None`` for ``k == 0`` or without such steps). Where the
    steps record their own depth (``num_speculative_tokens``: dynamic depth), each step's k is its own.
    """
    if steps.empty or not {"num_tokens", "num_reqs", "num_draft_tokens"} <= set(steps.columns):
        return {}
    decode = steps[(steps["num_reqs"] > 0) & (steps["num_tokens"] == steps["num_reqs"] + steps["num_draft_tokens"])]
    summary: dict = {"steps.decode_steps": len(decode)}
    for phase in (*STEP_PHASES, "step_ms"):
        values = pd.to_numeric(decode[phase], errors="coerce").dropna() if phase in decode else pd.Series()
        summary[f"steps.decode_{phase}"] = float(values.mean()) if len(values) else None
    per_forward = None
    if k > 0 and "draft_ms" in decode:
        depth = (pd.to_numeric(decode["num_speculative_tokens"], errors="coerce").fillna(k)
                 if "num_speculative_tokens" in decode else pd.Series(k, index=decode.index))
        full = (decode["num_draft_tokens"] == decode["num_reqs"] * depth) & (depth > 0)
        values = pd.to_numeric(decode.loc[full, "draft_ms"], errors="coerce") / depth[full]
        values = values.dropna()
        values = values[values > 0]
        per_forward = float(values.mean()) if len(values) else None
    summary["steps.draft_ms_per_forward"] = per_forward
    if "repeat" in steps and steps["repeat"].nunique() > 1:
        parts = [decode_step_summary(part.drop(columns="repeat"), k) for _, part in steps.groupby("repeat", sort=True)]
        for name in ("decode_verify_ms", "draft_ms_per_forward"):
            summary[f"steps.by_repeat.{name}"] = [part.get(f"steps.{name}") for part in parts]
        summary["steps.by_repeat.num_reqs_mean"] = [float(part["num_reqs"].mean())
                                                    for _, part in steps.groupby("repeat", sort=True)]
    return summary


def _with_acceptance_intervals(metrics: dict) -> dict:
    """``metrics`` with ``intervals.acceptance`` computed from its per-request histograms where the record has
    none (a record from before intervals existed): the same seeded bootstrap a run makes
    (:func:`specexp.measure.intervals.bootstrap_acceptance`, seed 0), marked ``source: computed on load``."""
    histograms = metrics.get("acceptance_histogram_per_request")
    if (metrics.get("intervals") or {}).get("acceptance") or not isinstance(histograms, dict) or not histograms:
        return metrics
    from specexp.measure.intervals import bootstrap_acceptance

    boot = {**bootstrap_acceptance(list(histograms.values())), "source": "computed on load"}
    return {**metrics, "intervals": {**(metrics.get("intervals") or {}), "acceptance": boot}}


def _figure(figures: dict, name: str):
    node = figures
    for part in name.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def measurement_columns(record: dict) -> dict:
    """The per-repeat lists (``repeats.<figure>``) and how the run was measured (``measurement.*``)."""
    repeats = record.get("repeats") or []
    row = {f"repeats.{name}": [_figure(r.get("figures") or {}, name) for r in repeats] for name in REPEAT_FIGURES}
    if not repeats:  # a record from before repeats: its one pass
        metrics = record.get("metrics") or {}
        row = {f"repeats.{name}": [_figure(metrics, name)] for name in REPEAT_FIGURES}
    for level in GROUP_LEVELS:
        row[f"repeats.{level}"] = _group_repeats(repeats, level)
    measure = record.get("measure") or {}
    for key in ("order", "engine_builds", "warmup_requests"):
        row[f"measurement.{key}"] = measure.get(key)
    readings = [(measure.get("machine") or {}).get("before")]
    readings += [(r.get("machine") or {}).get("after") for r in repeats]
    row["measurement.load_avg_1m"] = [(reading.get("load_avg") or [None])[0] for reading in readings
                                      if isinstance(reading, dict) and reading.get("load_avg")]
    row["measurement.cpu_count"] = ((measure.get("machine") or {}).get("before") or {}).get("cpu_count")
    row["measurement.repeat_times"] = [r.get("started_at") for r in repeats]
    row["measurement.repeat_wall_s"] = [r.get("wall_s") for r in repeats]
    return row


def _group_repeats(repeats: list[dict], level: str) -> dict:
    """``{group: {figure: [value of repeat 0, 1, ...]}}`` from the repeats' ``figures.<level>``; ``{}`` unless
    every repeat kept them."""
    per_repeat = [(r.get("figures") or {}).get(level) for r in repeats]
    if not per_repeat or not all(isinstance(groups, dict) for groups in per_repeat):
        return {}
    out: dict = {}
    for groups in per_repeat:
        for name, figures in groups.items():
            for figure, value in (figures or {}).items():
                out.setdefault(name, {}).setdefault(figure, []).append(value)
    return out


def _depth(value) -> int | None:
    """A record's k as an int (None when not recorded); a ValueError naming the value otherwise."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not float(value).is_integer() or value < 0:
        raise ValueError(f"{K_COLUMN} is {value!r}, not a depth (an integer >= 0)")
    return int(value)


def record_row(record: dict, run_dir: Path | None = None, steps: pd.DataFrame | None = None) -> dict:
    """One tidy row from a result.json dict (and optionally its steps table)."""
    run_dir = Path(run_dir or record.get("run_dir") or ".")
    config = record.get("config") or {}
    metrics = record.get("metrics") or {}
    row = {
        "status": record.get("status"),
        "error": record.get("error"),
        "experiment": record.get("experiment") or config.get("name"),
        "run_dir": str(run_dir),
        "started_at": record.get("started_at"),
        "run_duration_s": record.get("duration_s"),
        "sweep_group": _sweep_group(record, run_dir),
        "job_num": int(run_dir.name) if run_dir.name.isdigit() else None,
    }
    row.update(flatten(config))
    row["k"] = _depth(row.get(K_COLUMN, metrics.get("num_speculative_tokens")))
    if row["k"] is None and row["status"] == "ok":
        raise ValueError(f"it says ok but records no {K_COLUMN}")
    row.update(flatten(_with_acceptance_intervals(metrics), keep=NESTED_METRICS))
    row.update(flatten(record.get("env") or {}, "env."))
    row.update(measurement_columns(record))
    row.setdefault("num_repeats", len(record.get("repeats") or []) or 1)
    if steps is not None:
        row.update(decode_step_summary(steps, int(row["k"] or 0)))
    return row


class UnreadableRun(ValueError):
    """A run directory whose result.json cannot be used; the message is one line saying why."""


def read_record(run_dir: str | Path) -> dict:
    """The result.json dict of ``run_dir``, checked to be a run record (a JSON object with a ``status``
    string, a ``config`` object and, when ``ok``, a ``metrics`` object). Raises :class:`UnreadableRun`."""
    path = Path(run_dir) / RESULT_FILE
    try:
        record = json.loads(path.read_text())
    except OSError as e:
        raise UnreadableRun(f"cannot read {RESULT_FILE}: {e.strerror or e}") from e
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UnreadableRun(f"{RESULT_FILE} is not valid JSON (cut short or corrupt?): {e}") from e
    if not isinstance(record, dict):
        raise UnreadableRun(f"{RESULT_FILE} holds a {type(record).__name__}, not a run record object")
    if not isinstance(record.get("status"), str):
        raise UnreadableRun(f"{RESULT_FILE} has no 'status' (ok, failed or interrupted): not a specexp run record")
    if not isinstance(record.get("config"), dict):
        raise UnreadableRun(f"{RESULT_FILE} has no 'config' object: not a complete run record")
    if record["status"] == "ok" and not isinstance(record.get("metrics"), dict):
        raise UnreadableRun(f"{RESULT_FILE} says ok but has no 'metrics' object: a partial record")
    return record


def read_run(run_dir: str | Path, steps: bool = True) -> dict:
    """The tidy row of one run directory (see the module docstring for the columns). Raises
    :class:`UnreadableRun` when its result.json is not a usable run record; an unreadable steps.parquet only
    leaves out the ``steps.*`` columns (with a warning)."""
    run_dir = Path(run_dir)
    record = read_record(run_dir)
    table = None
    if steps and (run_dir / STEPS_FILE).is_file():
        try:
            table = pd.read_parquet(run_dir / STEPS_FILE)
        except Exception as e:  # noqa: BLE001 - pyarrow raises several types for a cut-short file
            warnings.warn(f"{run_dir / STEPS_FILE}: unreadable ({type(e).__name__}); its step timings are left out",
                          stacklevel=2)
    try:
        return record_row(record, run_dir, table)
    except (TypeError, ValueError, AttributeError) as e:
        raise UnreadableRun(f"{RESULT_FILE} has an unexpected shape: {e}") from e


def read_runs(paths: str | Path | Iterable[str | Path], steps: bool = True) -> tuple[list[dict], list[tuple[Path, str]]]:
    """(rows, skipped): the tidy row of every run found under ``paths`` (:func:`find_run_dirs`), and
    ``(run_dir, reason)`` for each run directory whose record could not be used."""
    rows, skipped = [], []
    for run_dir in find_run_dirs(paths):
        try:
            rows.append(read_run(run_dir, steps=steps))
        except UnreadableRun as e:
            skipped.append((run_dir, str(e)))
    return rows, skipped


def runs_frame(rows: list[dict]) -> pd.DataFrame:
    """Rows -> DataFrame with record columns first, sorted by sweep group, experiment and k."""
    df = pd.DataFrame(rows)
    if df.empty:
        return pd.DataFrame(columns=[*RECORD_COLUMNS, "k"])
    front = [c for c in (*RECORD_COLUMNS, "k") if c in df.columns]
    df = df[front + [c for c in df.columns if c not in front]]
    sort = [c for c in ("sweep_group", "experiment", "started_at", "k", "job_num") if c in df.columns]
    df = df.sort_values(sort, na_position="last", kind="stable").reset_index(drop=True)
    return df


def load_runs(
    source: str | Path | Iterable[str | Path] | None = None,
    *,
    wandb_project: str | None = None,
    steps: bool = True,
    status: str | None = None,
) -> pd.DataFrame:
    """Load runs as one tidy row per run (columns: see the module docstring).

    ``source``: a runs directory, sweep directory, run directory, result.json or glob, or a list of them
    (symlinked directories are followed; see :func:`find_run_dirs`); default :func:`runs_dir`.
    ``wandb_project`` (``"entity/project"`` or ``"project"``): read *online*
    W&B runs instead (needs network and an API key; see :mod:`specexp.analysis.wandb_source`).
    ``steps``: also summarise each run's steps.parquet into ``steps.*`` columns. ``status``: keep only
    runs with this status (e.g. ``"ok"``); default keeps all, failed runs included. A run directory whose
    result.json is unusable (cut short, not a run record) is left out with a warning and listed in
    ``df.attrs["skipped"]`` as ``(run_dir, reason)``.
    """
    if wandb_project is not None:
        from specexp.analysis.wandb_source import load_wandb_rows

        rows, skipped = load_wandb_rows(wandb_project), []
    else:
        rows, skipped = read_runs(source if source is not None else runs_dir(), steps=steps)
        for run_dir, reason in skipped:
            warnings.warn(f"skipped {run_dir}: {reason}", stacklevel=2)
    df = runs_frame(rows)
    if status is not None and not df.empty:
        df = df[df["status"] == status].reset_index(drop=True)
    df.attrs["skipped"] = [(str(d), reason) for d, reason in skipped]
    return df


def select_sweep(df: pd.DataFrame, sweep: str | None = None) -> pd.DataFrame:
    """The runs of one sweep group: ``sweep`` by name, or the most recently started sweep if ``None``.
    Returns ``df`` unchanged when it has no sweep groups (single runs only) and an empty frame when it is
    empty."""
    if df.empty or df["sweep_group"].isna().all():
        return df
    if sweep is None:
        started = df.dropna(subset=["sweep_group"]).groupby("sweep_group")["started_at"].max()
        sweep = started.sort_values().index[-1]
    picked = df[df["sweep_group"] == sweep]
    if picked.empty:
        groups = ", ".join(sorted(df["sweep_group"].dropna().unique()))
        raise ValueError(f"no sweep named {sweep!r}: choose one of {groups}")
    return picked.reset_index(drop=True)


NO_RUNS_HINT = "create some with: python -m specexp run -m +exp=depth_sweep"


def load_sweep(path: str | Path | None = None, sweep: str | None = None, status: str | None = None) -> pd.DataFrame:
    """:func:`load_runs` + :func:`select_sweep` for notebooks, printing what was found — plainly saying so
    when there are no runs (the notebook then still runs top to bottom, its figures say "no runs")."""
    path = Path(path) if path is not None else runs_dir()
    df = load_runs(path, status=status)
    if df.empty:
        print(f"No runs found in {path}: {NO_RUNS_HINT}")
        return df
    df = select_sweep(df, sweep)
    group = df["sweep_group"].dropna()
    ks = sorted(int(k) for k in df["k"].dropna().unique())
    ok = int((df["status"] == "ok").sum())
    where = f"sweep {group.iloc[0]}" if len(group) else "single runs"
    print(f"{len(df)} runs ({ok} ok) of {where} in {path}; k = {', '.join(map(str, ks))}")
    return df
