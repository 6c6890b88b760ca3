"""Run lifecycle: resolved config -> validate -> RunSpec -> ``backend.run(spec)`` -> RunResult -> run record
(result.json, outputs.jsonl, steps.parquet, answers.jsonl) -> W&B -> summary table.

:func:`execute` is Hydra-free (a notebook can call it with a config from Hydra's compose API);
:func:`hydra_task` is the Hydra entry point. In a sweep (``-m``) every job runs in a fresh spawned process
(``isolate_sweep_jobs``) so GPU memory, CUDA-graph pools and peak-memory counters never leak from one job
into the next; a failed job writes its result.json and the sweep goes on.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import multiprocessing
import os
import platform
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import specexp
from specexp.errors import ConfigError
from specexp.tracking import records

EXIT_FAILED, EXIT_CONFIG, EXIT_INTERRUPTED = 1, 2, 130
log = logging.getLogger("specexp")


@dataclass
class RunContext:
    """Where a run lives. ``sweep_dir``/``job_num`` are set for sweep jobs (the W&B group is the sweep
    directory's name)."""

    run_dir: Path
    experiment: str
    sweep_dir: Path | None = None
    job_num: int | None = None

    def __post_init__(self) -> None:
        self.run_dir = Path(self.run_dir)
        self.sweep_dir = Path(self.sweep_dir) if self.sweep_dir is not None else None


# ------------------------------------------------------------------------------------------- validation


def _choice(name: str, value: Any, choices: tuple) -> None:
    if value not in choices:
        raise ConfigError(f"{name}={value!r} is not valid: choose one of {', '.join(map(str, choices))}")


def _check_values(cfg: dict) -> None:
    """Checks that need no file or model: names, ranges, enums."""
    from specexp import specs
    from specexp.backends import check_backend_name

    check_backend_name(cfg["backend"]["name"])
    k = cfg["speculator"]["num_speculative_tokens"]
    if not isinstance(k, int) or isinstance(k, bool) or k < 0:
        raise ConfigError(f"speculator.num_speculative_tokens={k!r} is not valid: use an integer >= 0 (0 = off)")
    _choice("pair.weights", cfg["pair"]["weights"], specs.WEIGHTS)
    _choice("pair.dtype", cfg["pair"]["dtype"], specs.DTYPES)
    _choice("engine.device", cfg["engine"]["device"], specs.DEVICES)
    _choice("engine.cudagraph_mode", cfg["engine"]["cudagraph_mode"], specs.CUDAGRAPH_MODES)
    if cfg["speculator"].get("cudagraph_mode") is not None:  # null: follow engine.cudagraph_mode
        _choice("speculator.cudagraph_mode", cfg["speculator"]["cudagraph_mode"], specs.CUDAGRAPH_MODES)
    sampling = cfg["sampling"]
    if sampling["temperature"] < 0:
        raise ConfigError(f"sampling.temperature={sampling['temperature']} is not valid: use >= 0 (0 = greedy)")
    if sampling["max_new_tokens"] < 1:
        raise ConfigError(f"sampling.max_new_tokens={sampling['max_new_tokens']} is not valid: use >= 1")
    mode = ((cfg.get("tracking") or {}).get("wandb") or {}).get("mode", "offline")
    _choice("tracking.wandb.mode", mode, ("offline", "online", "disabled"))
    if cfg["engine"]["max_model_len"] < 2:
        raise ConfigError(f"engine.max_model_len={cfg['engine']['max_model_len']} is not valid: use >= 2")


def _check_device(device: str) -> None:
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise ConfigError("engine.device=cuda but no CUDA GPU is available: use engine=cpu (engine.device=cpu)")


def _check_prompt_lengths(prompts: list, max_new_tokens: int, max_model_len: int) -> None:
    for p in prompts:
        if len(p.token_ids) + max_new_tokens > max_model_len:
            raise ConfigError(
                f"prompt '{p.id}' has {len(p.token_ids)} tokens + {max_new_tokens} new tokens >"
                f" engine.max_model_len={max_model_len}: raise engine.max_model_len or shorten the prompt"
            )


def build_run_spec(cfg: dict, ctx: RunContext):
    """Validate the resolved config ``cfg`` and build the :class:`specexp.specs.RunSpec` (models resolved,
    prompts tokenized). Raises :class:`ConfigError` before any model is loaded."""
    from specexp import pairs, specs
    from specexp.workloads import load_prompts
    from specexp.workloads.benchmarks import resolve_max_prompt_tokens

    _check_values(cfg)
    _check_device(cfg["engine"]["device"])
    pair_cfg = cfg["pair"]
    target = pairs.describe_model(str(pair_cfg["target"]["path"]), pair_cfg["weights"])
    draft = pairs.describe_model(str(pair_cfg["draft"]["path"]), pair_cfg["weights"])
    pairs.check_same_tokenizer(target, draft)
    pair = specs.PairSpec(
        name=pair_cfg.get("name", "pair"), target=target, draft=draft, weights=pair_cfg["weights"],
        dtype=pair_cfg["dtype"], init_seed=pair_cfg.get("init_seed", cfg["engine"]["seed"]),
    )
    workload = specs.group_spec(specs.WorkloadSpec, cfg["workload"])
    sampling = specs.group_spec(specs.SamplingSpec, cfg["sampling"])
    if workload.name == "random":  # the latency workload: exactly output_len tokens per request
        sampling = dataclasses.replace(sampling, max_new_tokens=workload.output_len or sampling.max_new_tokens,
                                       ignore_eos=True)
    engine = specs.group_spec(specs.EngineSpec, cfg["engine"])
    prompts = load_prompts(workload, target.tokenizer_path, target.vocab_size, model_dir=target.path,
                           max_prompt_tokens=resolve_max_prompt_tokens(workload.options.get("max_prompt_tokens"),
                                                                       engine.max_model_len, sampling.max_new_tokens))
    _check_prompt_lengths(prompts, sampling.max_new_tokens, engine.max_model_len)
    backend_cfg = dict(cfg["backend"])
    return specs.RunSpec(
        experiment=ctx.experiment,
        backend=backend_cfg.pop("name"),
        pair=pair,
        speculator=specs.group_spec(specs.SpeculatorSpec, cfg["speculator"]),
        short_conv=specs.group_spec(specs.ShortConvSpec, cfg.get("short_conv")),
        engine=engine,
        sampling=sampling,
        workload=workload,
        prompts=prompts,
        output_dir=str(ctx.run_dir),
        config=cfg,
        backend_options=backend_cfg,
    )


# ---------------------------------------------------------------------------------------------- record


def _git_sha() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=Path(specexp.__file__).parent, capture_output=True, text=True, check=False,
            timeout=5,
        )
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def environment(device: str) -> dict:
    """Facts about where the run ran: python, torch, transformers, device, gpu, specexp version, git sha,
    host and process id."""
    env = {
        "python": platform.python_version(),
        "specexp_version": specexp.__version__,
        "git_sha": _git_sha(),
        "device": device,
        "gpu": None,
        "hostname": platform.node(),
        "pid": os.getpid(),
    }
    for module in ("torch", "transformers"):
        mod = sys.modules.get(module)
        env[module] = getattr(mod, "__version__", None) if mod else None
    if env["torch"] is None:
        env["torch"] = _torch_version()
    return env


def _torch_version() -> str | None:
    try:
        import torch
    except Exception:  # noqa: BLE001 - e.g. an import that a Ctrl-C cut short: the record matters more
        return None
    return torch.__version__


def _write_outputs(run_dir: Path, result, spec) -> None:
    from specexp.tracking import spec_bench

    records.write_jsonl(run_dir / records.OUTPUTS_FILE, [r.to_row() for r in result.requests])
    records.write_steps(run_dir / records.STEPS_FILE, result.steps)
    records.write_jsonl(run_dir / records.ANSWERS_FILE,
                        spec_bench.answers(result.requests, spec_bench.model_id(spec.config)))


def _error_line(e: BaseException) -> str:
    if isinstance(e, ConfigError):
        return str(e)
    first = (str(e).strip().splitlines() or [""])[0]
    return f"{type(e).__name__}: {first}" if first else type(e).__name__


def wandb_options(cfg: dict, ctx: RunContext) -> dict:
    """``wandb.init`` keywords of a run: sweep jobs share ``group`` (the sweep directory's name) and
    ``job_type`` is the experiment name."""
    wandb_cfg = (cfg.get("tracking") or {}).get("wandb") or {}
    return {
        "mode": wandb_cfg.get("mode", "offline"),
        "project": wandb_cfg.get("project", "specexp"),
        "entity": wandb_cfg.get("entity"),
        "group": wandb_cfg.get("group") or (ctx.sweep_dir.name if ctx.sweep_dir else None),
        "job_type": ctx.experiment,
        "name": ctx.run_dir.name if ctx.sweep_dir is None else f"{ctx.sweep_dir.name}/{ctx.run_dir.name}",
        "tags": list(wandb_cfg.get("tags") or []),
    }


def _track(record: dict) -> None:
    """Log the run to W&B; rewrites result.json only if the mode actually used differs (online fell back)."""
    from specexp.tracking.wandb_run import log_run

    options = dict(record["wandb"])
    mode = options.pop("mode")
    try:
        used = log_run(record, Path(record["run_dir"]), mode, options)
    except Exception as e:  # noqa: BLE001 - W&B is never required for a run to finish
        print(f"specexp: warning: W&B logging failed ({_error_line(e)}); the run record is complete",
              file=sys.stderr)
        used = "failed"
    if used != mode:
        record["wandb"]["mode"] = used
        records.write_result(Path(record["run_dir"]), record)


def execute(cfg: dict, ctx: RunContext) -> dict:
    """Run one experiment from the resolved config ``cfg`` (a plain dict) into ``ctx.run_dir``.

    Always writes result.json (status ``ok``/``failed``/``interrupted``); outputs.jsonl, steps.parquet and
    answers.jsonl only when the backend finished. Returns the result record. A KeyboardInterrupt is
    recorded and then re-raised; every other error is recorded and printed as one line on stderr.
    """
    from specexp.backends import get_backend, run_backend
    from specexp.progress import console_progress
    from specexp.tracking.summary import format_summary

    run_dir = ctx.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    started = time.time()
    record = {
        "status": "failed",
        "error": None,
        "experiment": ctx.experiment,
        "run_dir": str(run_dir),
        "started_at": dt.datetime.fromtimestamp(started).isoformat(timespec="seconds"),
        "duration_s": None,
        "config": cfg,
        "env": {},
        "metrics": {},
        "wandb": wandb_options(cfg, ctx),
    }
    interrupted = None
    try:
        spec = build_run_spec(cfg, ctx)
        backend = get_backend(spec.backend)
        log.info("starting backend %s: %s, k=%d, %d prompts", spec.backend, spec.pair.name,
                 spec.speculator.num_speculative_tokens, len(spec.prompts))
        with console_progress() as progress:
            result = run_backend(backend, spec, progress)
        _write_outputs(run_dir, result, spec)
        record["metrics"] = result.metrics
        record["env"] = {**environment(spec.engine.device), **result.env}
        record["status"] = "ok"
    except KeyboardInterrupt as e:
        record["status"], record["error"], interrupted = "interrupted", "interrupted (KeyboardInterrupt)", e
    except Exception as e:  # noqa: BLE001 - every failure is recorded in result.json
        record["error"] = _error_line(e)
        record["error_type"] = "config" if isinstance(e, ConfigError) else type(e).__name__
        if not isinstance(e, ConfigError):
            (run_dir / "error.log").write_text(traceback.format_exc())
    record["env"] = record["env"] or environment(str(cfg.get("engine", {}).get("device")))
    record["duration_s"] = time.time() - started
    records.write_result(run_dir, record)
    if interrupted is not None:
        raise interrupted
    if record["status"] != "ok":
        print(f"specexp: error: {record['error']}", file=sys.stderr, flush=True)
    _track(record)
    if record["status"] == "ok":
        print(format_summary(record), flush=True)
    return record


def exit_code(record: dict) -> int:
    """Process exit status for a run record: 0 ok, 2 bad config, 130 interrupted, 1 other failures."""
    if record["status"] == "ok":
        return 0
    if record["status"] == "interrupted":
        return EXIT_INTERRUPTED
    return EXIT_CONFIG if record.get("error_type") == "config" else EXIT_FAILED


# ----------------------------------------------------------------------------------------------- hydra

# (job_num, run_dir, status) of the sweep jobs this process launched (BasicLauncher runs them here).
SWEEP_JOBS: list[tuple[int, str, str]] = []


def _child(cfg: dict, ctx: RunContext) -> None:
    try:
        record = execute(cfg, ctx)
    except KeyboardInterrupt:
        sys.exit(EXIT_INTERRUPTED)
    sys.exit(exit_code(record))


def execute_in_fresh_process(cfg: dict, ctx: RunContext) -> str:
    """:func:`execute` in a newly spawned interpreter (nothing inherited but the arguments); returns the
    job's status as its result.json records it."""
    process = multiprocessing.get_context("spawn").Process(target=_child, args=(cfg, ctx), name=f"job-{ctx.job_num}")
    process.start()
    try:
        process.join()
    except KeyboardInterrupt:  # Ctrl-C reached the child too: let it write its record, then stop the sweep
        process.join(timeout=30)
        raise
    try:
        return records.read_result(ctx.run_dir)["status"]
    except (OSError, ValueError):
        return "failed"  # the child died before writing anything (e.g. killed for memory)


def hydra_task(cfg) -> str:
    """Hydra task function: one run, or one job of a sweep. Returns the run's status.

    A single run that fails exits the process with :func:`exit_code`; a sweep job never raises (the sweep
    goes on), its status is collected in :data:`SWEEP_JOBS`.
    """
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode
    from omegaconf import OmegaConf
    from omegaconf.errors import MissingMandatoryValue

    hydra_cfg = HydraConfig.get()
    multirun = hydra_cfg.mode == RunMode.MULTIRUN
    missing = sorted(OmegaConf.missing_keys(cfg))
    if missing:
        print(f"specexp: error: no value for {', '.join(missing)}: set it on the command line"
              f" ({missing[0]}=...)", file=sys.stderr)
        sys.exit(EXIT_CONFIG)
    try:
        plain = OmegaConf.to_container(cfg, resolve=True)
    except MissingMandatoryValue as e:  # an interpolation pointing at a missing value
        print(f"specexp: error: {str(e).splitlines()[0]}", file=sys.stderr)
        sys.exit(EXIT_CONFIG)
    ctx = RunContext(
        run_dir=Path(hydra_cfg.runtime.output_dir),
        experiment=str(plain.get("name", "run")),
        sweep_dir=Path(hydra_cfg.sweep.dir).resolve() if multirun else None,
        job_num=hydra_cfg.job.num if multirun else None,
    )
    if not multirun:
        record = execute(plain, ctx)
        if record["status"] != "ok":
            sys.exit(exit_code(record))
        return "ok"
    if plain.get("isolate_sweep_jobs", True):
        status = execute_in_fresh_process(plain, ctx)
    else:
        status = execute(plain, ctx)["status"]
    SWEEP_JOBS.append((ctx.job_num, str(ctx.run_dir), status))
    return status
