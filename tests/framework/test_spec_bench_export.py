"""``specexp export-specbench``: a sweep over depth and engine.seed becomes Spec-Bench's
``model_answer_temp0_run_{1,2,3}/<model_id>.jsonl`` layout, and Spec-Bench's figures recomputed from that layout
(as its README documents the format: ``choices[0]`` with ``new_tokens``, ``wall_time``, ``accept_lengths``)
equal what specexp reports."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from specexp.cli import compose_config
from specexp.experiment import RunContext, execute

QUESTIONS = [
    {"question_id": 81, "category": "writing", "turns": ["Write a poem about tea.", "Make it rhyme."]},
    {"question_id": 82, "category": "math", "turns": ["What is 2 + 2?", "Times 3?"]},
    {"question_id": 201, "category": "qa", "turns": ["Who wrote Hamlet?"]},
    {"question_id": 202, "category": "translation", "turns": ["Translate to German: good morning"]},
]
SEEDS = (0, 1, 2)
DEPTHS = (0, 3)


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory, tiny_llama_dir):
    """A sweep of k = 0, 3 x engine.seed = 0, 1, 2 on two- and one-turn questions (job directories 0..5); the
    target drafts for itself, so drafts are accepted and the two acceptance figures differ."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("sweep")
    path = root / "question.jsonl"
    path.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
    sweep = root / "specbench_sweep"
    job = 0
    for k in DEPTHS:
        for seed in SEEDS:
            cfg = compose_config(["pair=local", f"pair.target.path={tiny_llama_dir}",
                                  f"pair.draft.path={tiny_llama_dir}", "workload=specbench",
                                  f"workload.path={path}", "workload.one_at_a_time=true", "sampling.max_new_tokens=12",
                                  f"speculator.num_speculative_tokens={k}", f"engine.seed={seed}", "tracking=disabled"])
            record = execute(OmegaConf.to_container(cfg, resolve=True),
                             RunContext(run_dir=sweep / str(job), experiment="specbench", sweep_dir=sweep, job_num=job))
            assert record["status"] == "ok", record["error"]
            job += 1
    torch.set_num_threads(threads)
    return sweep


def export(*args):
    return subprocess.run([sys.executable, "-m", "specexp", "export-specbench", *map(str, args)], check=False,
                          capture_output=True, text=True)


def spec_bench_figures(answer_file: Path) -> dict:
    """Spec-Bench's figures of one answer file, from its documented format: tokens/s per question (its turns'
    new tokens over their wall time), averaged over questions, and the mean of every step's accept length."""
    speeds, steps, tokens = [], [], 0
    for line in answer_file.read_text().splitlines():
        choice = json.loads(line)["choices"][0]
        speeds.append(sum(choice["new_tokens"]) / sum(choice["wall_time"]))
        steps.extend(choice["accept_lengths"])
        tokens += sum(choice["new_tokens"])
    return {"tokens_per_s": sum(speeds) / len(speeds), "mean_accepted_tokens": sum(steps) / len(steps),
            "num_steps": len(steps), "new_tokens": tokens}


def results_by_seed_and_k(sweep: Path) -> dict:
    out = {}
    for path in sweep.glob("*/result.json"):
        record = json.loads(path.read_text())
        out[(record["config"]["engine"]["seed"], record["config"]["speculator"]["num_speculative_tokens"])] = record
    return out


def test_the_export_writes_spec_benchs_layout_from_three_seeds(sweep_dir, tmp_path, tiny_llama_dir):
    done = export(sweep_dir, tmp_path / "out")
    assert done.returncode == 0, done.stderr
    target = draft = Path(tiny_llama_dir).name
    vanilla, sps = f"{target}-vanilla-native-float32-temp-0.0", f"{target}-sps-{draft}-k3-native-float32-temp-0.0"
    for run in (1, 2, 3):
        files = sorted(p.name for p in (tmp_path / "out" / f"model_answer_temp0_run_{run}").iterdir())
        assert files == sorted([f"{vanilla}.jsonl", f"{sps}.jsonl"])
    lines = [json.loads(line) for line in (tmp_path / "out" / "model_answer_temp0_run_1" / f"{sps}.jsonl")
             .read_text().splitlines()]
    assert [line["question_id"] for line in lines] == [81, 82, 201, 202]
    assert [len(line["choices"][0]["turns"]) for line in lines] == [2, 2, 1, 1]
    assert {line["model_id"] for line in lines} == {sps} and "export-specbench: 6 answer files" in done.stdout


def test_spec_benchs_figures_recomputed_from_the_export_equal_specexps(sweep_dir, tmp_path):
    assert export(sweep_dir, tmp_path / "out").returncode == 0
    results = results_by_seed_and_k(sweep_dir)
    for run, seed in enumerate(SEEDS, start=1):
        speeds = {}
        for k in DEPTHS:
            (answer_file,) = (tmp_path / "out" / f"model_answer_temp0_run_{run}").glob(
                "*-vanilla-*.jsonl" if k == 0 else f"*-k{k}-*.jsonl")
            figures = spec_bench_figures(answer_file)
            m = results[(seed, k)]["metrics"]
            assert figures["mean_accepted_tokens"] == pytest.approx(m["spec_bench_mean_accepted_tokens"], rel=1e-12)
            assert figures["new_tokens"] == m["num_output_tokens"]
            assert figures["mean_accepted_tokens"] * figures["num_steps"] == pytest.approx(m["num_output_tokens"])
            for task in m["by_task"].values():  # the same figure per task
                assert task["spec_bench_mean_accepted_tokens"] >= 1.0
            speeds[k] = figures["tokens_per_s"]
            if k == 0:
                assert figures["mean_accepted_tokens"] == 1.0
            else:  # specexp's acceptance length averages over drafting steps only, so it is never below
                assert m["acceptance_length"] >= figures["mean_accepted_tokens"] > 1.0
        assert speeds[3] > 0 and speeds[0] > 0


def test_two_runs_for_one_file_and_an_empty_directory_are_one_line_errors(sweep_dir, tmp_path):
    import shutil

    twice = tmp_path / "twice"
    shutil.copytree(sweep_dir / "0", twice / "a")
    shutil.copytree(sweep_dir / "0", twice / "b")
    done = export(twice, tmp_path / "out")
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1
    assert "both give" in done.stderr and "engine.seed=0" in done.stderr
    (tmp_path / "empty").mkdir()
    done = export(tmp_path / "empty", tmp_path / "out")
    assert done.returncode == 2 and done.stderr.strip() == (f"specexp: error: no finished runs with answers.jsonl"
                                                            f" under {tmp_path / 'empty'}")


def test_fewer_than_three_seeds_are_exported_with_a_notice(sweep_dir, tmp_path):
    import shutil

    one = tmp_path / "one"
    shutil.copytree(sweep_dir / "0", one / "0")
    done = export(one, tmp_path / "out")
    assert done.returncode == 0 and "Spec-Bench reads 3 runs per model" in done.stderr
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["model_answer_temp0_run_1"]
