"""Optional second source of runs: W&B runs logged *online* (``tracking.wandb.mode=online``).

result.json in each run directory is the source of truth: wandb cannot read offline runs back (upload them
first with ``wandb sync <run_dir>/wandb/offline-run-*``), and a W&B summary holds only scalar metrics.
Each specexp run logs its result.json as an artifact of type ``run-record``; this module prefers that
artifact, so a W&B-loaded row equals the local one (minus the ``steps.*`` columns: steps.parquet is not
uploaded). Runs without the artifact are rebuilt from their config and summary (scalars only: no
per-position lists, so they give no α).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from specexp.analysis.load import record_row

ARTIFACT_TYPE = "run-record"


def unflatten(flat: dict) -> dict:
    """``{"a.b": 1}`` -> ``{"a": {"b": 1}}`` (keys starting with ``_`` are W&B's own and dropped)."""
    tree: dict = {}
    for key, value in flat.items():
        if key.startswith("_"):
            continue
        node = tree
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return tree


def _artifact_record(run) -> dict | None:
    for artifact in run.logged_artifacts():
        if artifact.type != ARTIFACT_TYPE:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(artifact.download(root=tmp)) / "result.json"
            if path.is_file():
                return json.loads(path.read_text())
    return None


def _summary_record(run) -> dict:
    summary = dict(run.summary)
    status = summary.pop("status", None)
    error = summary.pop("error", None)
    return {
        "status": status, "error": error, "experiment": run.job_type, "run_dir": f"wandb:{run.path}",
        "config": unflatten(dict(run.config)),
        "metrics": unflatten({k: v for k, v in summary.items() if not isinstance(v, dict)}),
        "wandb": {"group": run.group},
    }


def load_wandb_rows(project: str, api=None, filters: dict | None = None) -> list[dict]:
    """Tidy rows (as :func:`specexp.analysis.load.record_row` makes) of the runs of ``project``
    (``"entity/project"`` or ``"project"``). Needs network and a W&B API key; ``api`` defaults to
    ``wandb.Api()``."""
    if api is None:
        try:
            import wandb
        except ImportError as e:
            raise RuntimeError("reading W&B runs needs the wandb package; result.json files need nothing") from e
        api = wandb.Api()
    rows = []
    for run in api.runs(project, filters=filters or {}):
        record = _artifact_record(run) or _summary_record(run)
        record.setdefault("wandb", {}).setdefault("group", run.group)
        row = record_row(record, Path(record.get("run_dir") or run.name))
        row["wandb_path"] = "/".join(run.path) if isinstance(run.path, (list, tuple)) else str(run.path)
        rows.append(row)
    return rows
