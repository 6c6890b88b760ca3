"""How one zoo model is trained: corpus → batches → AdamW steps → checkpoints → HF directory.

Plain PyTorch + transformers (no Hydra), so it runs on the GPU machine:
``python -m specexp.zoo.train_loop tiny_llama [--steps N] [--device cuda]``.

Where it writes: ``spec.out_dir``, by default ``experiments/zoo/<name>`` under the working directory. The
shipped models in ``specexp/zoo/`` (which the quickstart, the tests and the committed figures use) are
replaced only when asked (``overwrite_shipped=True``; ``specexp.zoo.build`` does, it rebuilds the zoo).
On a CPU, one timed step before training prints how long the run will take.

Resumption: every ``checkpoint_every_steps`` (and on Ctrl-C) the model, optimizer and step are written
atomically to ``<ckpt_dir>/last.pt``; a later run with the same spec continues from that step. Batches
depend only on ``(seed, step)``, so an interrupted-and-resumed run sees the same data as an uninterrupted one.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import platform
import shutil
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from specexp.errors import ConfigError
from specexp.zoo import ZOO_DIR, resolve_model_dir
from specexp.zoo.architectures import build_model, count_parameters
from specexp.zoo.corpora import load_corpus
from specexp.zoo.data import eval_windows, train_batch
from specexp.zoo.distill import cross_entropy, distillation_loss, next_token_logits, teacher_log_probs
from specexp.zoo.spec import TrainConfig, ZooModelSpec, load_spec
from specexp.zoo.tokenizer import SHIPPED_TOKENIZER_PATH, load_tokenizer

CHECKPOINT_NAME = "last.pt"
TRAINING_RECORD_NAME = "training.json"
DEFAULT_OUT_ROOT = Path("experiments") / "zoo"
"""Trained models go to ``<DEFAULT_OUT_ROOT>/<name>`` (relative to the working directory) unless told otherwise."""


@dataclass
class TrainResult:
    """What a call to :func:`train` reached. ``finished`` is False when it stopped early (checkpointed)."""

    name: str
    step: int
    finished: bool
    out_dir: Path | None
    record: dict[str, Any]


def output_dir(spec: ZooModelSpec, overwrite_shipped: bool = False) -> Path:
    """Where :func:`train` saves ``spec``'s HF directory: ``specexp/zoo/<name>`` when ``overwrite_shipped``,
    else ``spec.out_dir`` or ``experiments/zoo/<name>``. :class:`ConfigError` for an ``out_dir`` inside the
    shipped zoo without ``overwrite_shipped``."""
    shipped = ZOO_DIR / spec.name
    if overwrite_shipped:
        return shipped
    out_dir = Path(spec.out_dir) if spec.out_dir else DEFAULT_OUT_ROOT / spec.name
    resolved, zoo = out_dir.resolve(), ZOO_DIR.resolve()
    if resolved == zoo or zoo in resolved.parents:
        raise ConfigError(
            f"out_dir={out_dir} is inside the installed package's zoo ({zoo}), whose models the quickstart, the "
            f"tests and the committed figures use: choose another out_dir, or add +overwrite_shipped=true to "
            f"replace the shipped {spec.name}"
        )
    return out_dir


def _shipped_train_time(name: str) -> str | None:
    """'28 s on 1x NVIDIA H200 (...)' from the shipped model's training record, or None."""
    try:
        record = json.loads((ZOO_DIR / name / TRAINING_RECORD_NAME).read_text())
        return f"{record['train_time_s']:.0f} s on {record['hardware']}"
    except (OSError, ValueError, KeyError, TypeError):
        return None


def print_cpu_estimate(name: str, step_s: float, steps_left: int, cfg: TrainConfig) -> None:
    """Before training on a CPU: how long ``steps_left`` steps of ``step_s`` seconds each take (held-out
    evaluations included: forward only, about a third of a step per batch), when that is, and the GPU."""
    evals = steps_left // cfg.eval_every_steps + 1
    eval_s = evals * math.ceil(cfg.eval_windows / cfg.batch_size) * step_s / 3
    total_s = steps_left * step_s + eval_s
    finish = time.strftime("%a %H:%M", time.localtime(time.time() + total_s))
    hours, rest = divmod(round(total_s), 3600)
    if hours:
        took = f"{hours} h {rest // 60:02d} min"
    else:
        took = f"{round(total_s / 60)} min" if total_s >= 90 else f"{total_s:.0f} s"
    print(f"[{name}] on CPU one training step takes {step_s:.1f} s: {steps_left} steps take about {took} "
          f"(ETA {finish}).", flush=True)
    shipped = _shipped_train_time(name)
    gpu = f" (the shipped {name} took {shipped})" if shipped else ""
    print(f"[{name}] a CUDA GPU trains it in minutes{gpu}: run the same command on a GPU machine "
          f"(zoo.train.device=auto picks it). For a quick try here: zoo.train.steps=20. Ctrl-C stops with a "
          f"checkpoint; the same command resumes.", flush=True)


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warm-up over ``warmup_steps``, then cosine decay to ``min_lr_ratio * lr`` at ``steps``."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = min(1.0, (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps))
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _autocast(device: torch.device):
    # bf16 on CUDA; fp32 on CPU (bf16 matmuls are ~30x slower on the 2-core CPUs specexp is built on).
    return torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else nullcontext()


_BUDGET_PROBE_STEPS = (5, 25)
"""Steps 5..25 time the step (after warm-up allocations) for ``time_budget_s``."""


def _fit_steps_to_budget(cfg: TrainConfig, step: int, step_s: float, elapsed_s: float, name: str) -> None:
    evals = cfg.steps // cfg.eval_every_steps + 1
    affordable = step + int((cfg.time_budget_s - elapsed_s) / (step_s * (1 + 0.02 * evals)))
    print(f"[{name}] {step_s * 1e3:.1f} ms/step; budget {cfg.time_budget_s:.0f}s affords ~{affordable} steps",
          flush=True)
    if affordable < cfg.steps:
        cfg.steps = max(affordable, step + 1)
        print(f"[{name}] steps lowered to {cfg.steps} to fit time_budget_s", flush=True)


def _make_optimizer(model: torch.nn.Module, cfg: TrainConfig, device: torch.device) -> torch.optim.Optimizer:
    params = list({id(p): p for p in model.parameters()}.values())
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.95), fused=device.type == "cuda")


def _save_checkpoint(path: Path, model, optimizer, step: int, spec: ZooModelSpec, history: list, elapsed_s: float,
                     best: dict[str, Any] | None):
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    state = {
        "step": step,
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "arch": spec.arch,
        "size": spec.size,
        "teachers": spec.teachers,
        "history": history,
        "elapsed_s": elapsed_s,
        "steps": spec.train.steps,
        "best": best,
    }
    torch.save(state, tmp)
    os.replace(tmp, path)


def _load_checkpoint(path: Path, spec: ZooModelSpec) -> dict[str, Any] | None:
    if not path.exists():
        return None
    state = torch.load(path, map_location="cpu", weights_only=False)
    if (state["arch"], state["size"], state["teachers"]) != (spec.arch, spec.size, spec.teachers):
        raise ValueError(
            f"checkpoint {path} is for {state['arch']} {state['size']} (teachers {state['teachers']}), "
            f"not {spec.arch} {spec.size} (teachers {spec.teachers}): delete it or set a different ckpt_dir"
        )
    return state


@torch.no_grad()
def held_out_loss(model, windows: torch.Tensor, batch_size: int, device: torch.device) -> float:
    """Mean next-token cross-entropy (nats) of ``model`` over ``windows: int64[n, seq_len + 1]``."""
    was_training = model.training
    model.eval()
    total, count = torch.zeros((), device=device), 0
    for i in range(0, windows.shape[0], batch_size):
        chunk = windows[i : i + batch_size]
        with _autocast(device):
            logits = next_token_logits(model, chunk[:, :-1])
        total += cross_entropy(logits, chunk[:, 1:]) * chunk.shape[0]
        count += chunk.shape[0]
    model.train(was_training)
    return float(total / count)


def _quiet_transformers() -> None:
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # "Loading weights" / "Writing model shards" bars between our own lines


def _load_teachers(spec: ZooModelSpec, device: torch.device) -> list[torch.nn.Module]:
    from transformers import AutoModelForCausalLM

    _quiet_transformers()

    teachers = []
    for name in spec.teachers:
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        teacher = AutoModelForCausalLM.from_pretrained(resolve_model_dir(name), dtype=dtype).to(device).eval()
        teachers.append(teacher.requires_grad_(False))
    return teachers


def _hardware(device: torch.device) -> str:
    if device.type == "cuda":
        return f"1x {torch.cuda.get_device_name(device)} (CUDA {torch.version.cuda}, torch {torch.__version__})"
    return f"CPU {platform.machine()} x{os.cpu_count()} (torch {torch.__version__})"


def _teacher_dirs(spec: ZooModelSpec) -> list[Path]:
    return [resolve_model_dir(name) for name in spec.teachers]


def train(spec: ZooModelSpec, overwrite_shipped: bool = False) -> TrainResult:
    """Train (or resume training) ``spec`` and, once all steps are done, save it as a HF directory in
    :func:`output_dir` (never the shipped ``specexp/zoo/<name>`` unless ``overwrite_shipped``)."""
    cfg = spec.train
    out_dir = output_dir(spec, overwrite_shipped)
    device = pick_device(cfg.device)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    ckpt_path = Path(spec.ckpt_dir or Path("outputs") / "zoo_ckpt" / spec.name) / CHECKPOINT_NAME

    tokenizer = load_tokenizer(SHIPPED_TOKENIZER_PATH)
    corpus = load_corpus(spec, tokenizer)
    train_stream, eval_stream = corpus.train.to(device), corpus.held_out.to(device)
    windows = eval_windows(eval_stream, cfg.seq_len, cfg.eval_windows)

    model = build_model(spec.arch, spec.size, seed=cfg.seed).to(device).train()
    optimizer = _make_optimizer(model, cfg, device)
    teachers = _load_teachers(spec, device)
    start_step, history, elapsed_before_s = 0, [], 0.0
    best: dict[str, Any] | None = None  # {"step", "loss", "model"}: lowest held-out loss so far (keep_best)
    state = _load_checkpoint(ckpt_path, spec)
    if state is not None:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start_step, history, elapsed_before_s = state["step"], state["history"], state["elapsed_s"]
        cfg.steps = min(cfg.steps, state["steps"])  # a time-budgeted run keeps the steps it settled on
        best = state.get("best")
        print(f"[{spec.name}] resuming from {ckpt_path} at step {start_step}/{cfg.steps}", flush=True)
    print(
        f"[{spec.name}] {spec.arch} {count_parameters(model) / 1e6:.2f}M params on {device}; "
        f"train stream {train_stream.numel():,} tokens, held-out {eval_stream.numel():,}; "
        f"teachers {', '.join(map(str, _teacher_dirs(spec))) or 'none'}; output {out_dir}",
        flush=True,
    )

    def step_loss(step: int) -> torch.Tensor:
        batch = train_batch(train_stream, cfg.batch_size, cfg.seq_len, cfg.seed, step)
        inputs, labels = batch[:, :-1], batch[:, 1:]
        with _autocast(device):
            logits = next_token_logits(model, inputs)
            if teachers:
                return distillation_loss(logits, teacher_log_probs(teachers, inputs), labels, cfg.kl_weight)[0]
            return cross_entropy(logits, labels)

    if device.type == "cpu" and start_step < cfg.steps:
        # One timed forward + backward (no optimizer step: the run's result is unchanged) before the long run.
        t_probe = time.perf_counter()
        step_loss(start_step).backward()
        optimizer.zero_grad(set_to_none=True)
        print_cpu_estimate(spec.name, time.perf_counter() - t_probe, cfg.steps - start_step, cfg)

    def checkpoint(step: int) -> None:
        _save_checkpoint(ckpt_path, model, optimizer, step, spec, history, elapsed_before_s + time.time() - t0, best)

    from tqdm.auto import tqdm

    t0 = time.time()
    step = start_step
    running = torch.zeros((), device=device)
    bar = tqdm(total=cfg.steps, initial=start_step, desc=spec.name, disable=not cfg.progress, mininterval=5.0)
    try:
        while step < cfg.steps:
            for group in optimizer.param_groups:
                group["lr"] = lr_at(step, cfg)
            loss = step_loss(step)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            optimizer.step()
            running += loss.detach()
            step += 1
            bar.update(1)
            if cfg.time_budget_s and start_step == 0 and step == _BUDGET_PROBE_STEPS[0]:
                _sync(device)
                t_probe = time.time()
            if cfg.time_budget_s and start_step == 0 and step == _BUDGET_PROBE_STEPS[1]:
                _sync(device)
                _fit_steps_to_budget(cfg, step, (time.time() - t_probe) / (step - _BUDGET_PROBE_STEPS[0]),
                                     time.time() - t0, spec.name)
                bar.total = cfg.steps
            if step % cfg.log_every_steps == 0 or step == cfg.steps:
                n = cfg.log_every_steps if step % cfg.log_every_steps == 0 else step % cfg.log_every_steps
                bar.set_postfix(loss=f"{float(running) / n:.3f}", lr=f"{lr_at(step - 1, cfg):.2e}")
                history.append({"step": step, "train_loss": float(running) / n})
                running.zero_()
            if step % cfg.eval_every_steps == 0 or step == cfg.steps:
                loss_ho = held_out_loss(model, windows, cfg.batch_size, device)
                history.append({"step": step, "held_out_loss": loss_ho})
                if cfg.keep_best and (best is None or loss_ho < best["loss"]):
                    best = {"step": step, "loss": loss_ho,
                            "model": {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}}
                print(f"[{spec.name}] step {step}: held-out loss {loss_ho:.4f}", flush=True)
            if step % cfg.checkpoint_every_steps == 0 or step == cfg.steps:
                checkpoint(step)
            if cfg.stop_after_steps is not None and step >= cfg.stop_after_steps and step < cfg.steps:
                checkpoint(step)
                print(f"[{spec.name}] stopped at step {step} (stop_after_steps); rerun to resume", flush=True)
                return TrainResult(spec.name, step, False, None, {})
    except KeyboardInterrupt:
        checkpoint(step)
        print(f"\n[{spec.name}] interrupted at step {step}; checkpoint {ckpt_path}; rerun to resume", flush=True)
        raise
    finally:
        bar.close()

    elapsed_s = elapsed_before_s + time.time() - t0
    selected_step = step
    if cfg.keep_best and best is not None:
        model.load_state_dict(best["model"])
        selected_step = best["step"]
    record = {
        "name": spec.name,
        "arch": spec.arch,
        "parameters": count_parameters(model),
        "size": spec.size,
        "teachers": spec.teachers,
        "steps": step,
        "selected_step": selected_step,
        "tokens_seen": selected_step * cfg.batch_size * cfg.seq_len,  # by the shipped weights
        "train_stream_tokens": train_stream.numel(),
        "held_out_tokens_evaluated": int(windows.numel() - windows.shape[0]),
        "held_out_loss": held_out_loss(model, windows, cfg.batch_size, device),
        "train": dataclasses.asdict(cfg),
        "hardware": _hardware(device),
        "train_time_s": round(elapsed_s, 1),
        "corpus": corpus.description,
        "corpus_split": corpus.split,
        "torch": torch.__version__,
        "history": history,
    }
    save_hf_dir(model, out_dir, record, corpus.tokenizer_config)
    print(f"[{spec.name}] done: {step} steps in {elapsed_s:.0f}s, held-out loss {record['held_out_loss']:.4f}; "
          f"saved {out_dir}", flush=True)
    return TrainResult(spec.name, step, True, out_dir, record)


def save_hf_dir(model: torch.nn.Module, out_dir: Path, record: dict[str, Any],
                tokenizer_config: dict | None = None) -> None:
    """Write ``model`` in bf16 safetensors + config, the shared tokenizer (with ``tokenizer_config.json``, e.g.
    a chat template, when given), and the training record."""
    _quiet_transformers()
    out_dir.mkdir(parents=True, exist_ok=True)
    model.to(torch.bfloat16).save_pretrained(out_dir)
    model.float()
    shutil.copyfile(SHIPPED_TOKENIZER_PATH, out_dir / "tokenizer.json")
    if tokenizer_config is not None:
        (out_dir / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=1) + "\n")
    (out_dir / TRAINING_RECORD_NAME).write_text(json.dumps(record, indent=1) + "\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Train one zoo model from conf/zoo/NAME.yaml (no Hydra).")
    parser.add_argument("config", help="zoo config name, e.g. tiny_llama")
    parser.add_argument("--steps", type=int)
    parser.add_argument("--device")
    parser.add_argument("--out-dir")
    parser.add_argument("--ckpt-dir")
    parser.add_argument("--overwrite-shipped", action="store_true", help="replace the shipped specexp/zoo/<name>")
    parser.add_argument("--data-path", help="the corpus file (gsm8k: GSM8K's train.jsonl)")
    args = parser.parse_args(argv)
    overrides = {k: v for k, v in {"steps": args.steps, "device": args.device}.items() if v is not None}
    spec = load_spec(args.config, **overrides)
    spec.out_dir = args.out_dir or spec.out_dir
    spec.ckpt_dir = args.ckpt_dir or spec.ckpt_dir
    spec.data_path = args.data_path or spec.data_path
    train(spec, overwrite_shipped=args.overwrite_shipped)


if __name__ == "__main__":
    main()
