"""Benchmark workloads (specbench, mtbench, humaneval, gsm8k, jsonl with field names): every line of the real
files loads, categories filter, num_prompts samples evenly with a seed, bad files name file, line and field."""

import collections
import gzip
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specexp.errors import ConfigError
from specexp.specs import WorkloadSpec, group_spec
from specexp.workloads import load_prompts
from specexp.workloads.benchmarks import data_dir
from specexp.workloads.selection import sample_evenly
from specexp.workloads.tasks import MT_BENCH_CATEGORIES, SPEC_BENCH_TASKS

DATA = data_dir()
FILES = {
    "specbench": DATA / "specbench" / "question.jsonl",
    "mtbench": DATA / "mtbench" / "question.jsonl",
    "humaneval": DATA / "humaneval" / "HumanEval.jsonl.gz",
    "gsm8k": DATA / "gsm8k" / "test.jsonl",
}


def workload(name, path, **values):
    return group_spec(WorkloadSpec, {"name": name, "path": str(path), "num_prompts": None, "seed": 0,
                                     "chat_template": "none", **values})


def real_file(name):
    path = FILES[name]
    if not path.is_file():
        pytest.skip(f"{path} not found (benchmark files live in ../shared/data or $SPECEXP_DATA_DIR)")
    return path


def non_blank_lines(path):
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return sum(1 for line in f if line.strip())


def test_every_spec_bench_question_loads_with_its_13_categories_and_6_tasks(tiny_tokenizer_path):
    path = real_file("specbench")
    prompts = load_prompts(workload("specbench", path), tiny_tokenizer_path, 384)
    assert len(prompts) == non_blank_lines(path) == 480
    categories = collections.Counter(p.category for p in prompts)
    assert len(categories) == 13 and all(categories[c] == 10 for c in MT_BENCH_CATEGORIES)
    assert sum(p.num_turns == 2 for p in prompts) == 80
    assert all(p.num_turns == 2 for p in prompts if p.category in MT_BENCH_CATEGORIES)
    assert collections.Counter(p.task for p in prompts) == {task: 80 for task in SPEC_BENCH_TASKS}
    assert all(p.turn == 1 for p in prompts) and len({p.id for p in prompts}) == 480
    first = json.loads(path.read_text().splitlines()[0])
    assert prompts[0].id == str(first["question_id"]) and prompts[0].text == first["turns"][0]


def test_every_mt_bench_question_loads_as_two_turns_of_task_mt_bench(tiny_tokenizer_path):
    path = real_file("mtbench")
    prompts = load_prompts(workload("mtbench", path), tiny_tokenizer_path, 384)
    assert len(prompts) == non_blank_lines(path) == 80
    assert {p.num_turns for p in prompts} == {2} and {p.task for p in prompts} == {"mt_bench"}
    assert set(collections.Counter(p.category for p in prompts).values()) == {10}
    assert prompts[0].request_id == f"{prompts[0].id}/turn1"


def test_every_humaneval_task_loads_from_the_gzipped_file(tiny_tokenizer_path):
    path = real_file("humaneval")
    prompts = load_prompts(workload("humaneval", path), tiny_tokenizer_path, 384)
    assert len(prompts) == non_blank_lines(path) == 164
    assert prompts[0].id == "HumanEval/0" and prompts[-1].id == "HumanEval/163"
    assert {p.category for p in prompts} == {"humaneval"} and prompts[0].text.startswith("from typing import")


def test_every_gsm8k_test_question_loads(tiny_tokenizer_path):
    path = real_file("gsm8k")
    prompts = load_prompts(workload("gsm8k", path), tiny_tokenizer_path, 384)
    assert len(prompts) == non_blank_lines(path) == 1319
    assert [p.id for p in prompts[:2]] == ["0", "1"] and {p.category for p in prompts} == {"gsm8k"}
    assert prompts[0].text == json.loads(path.read_text().splitlines()[0])["question"]


def test_num_prompts_samples_evenly_across_spec_bench_categories_with_a_seed(tiny_tokenizer_path):
    path = real_file("specbench")
    a = load_prompts(workload("specbench", path, num_prompts=26, seed=1), tiny_tokenizer_path, 384)
    assert set(collections.Counter(p.category for p in a).values()) == {2}
    assert a == load_prompts(workload("specbench", path, num_prompts=26, seed=1), tiny_tokenizer_path, 384)
    b = load_prompts(workload("specbench", path, num_prompts=26, seed=2), tiny_tokenizer_path, 384)
    assert [p.id for p in a] != [p.id for p in b]
    order = [p.id for p in load_prompts(workload("specbench", path), tiny_tokenizer_path, 384)]
    assert [p.id for p in a] == sorted((p.id for p in a), key=order.index), "chosen questions keep file order"


def test_categories_filter_and_an_unknown_one_lists_the_known(tiny_tokenizer_path):
    path = real_file("specbench")
    kept = load_prompts(workload("specbench", path, categories=["qa", "writing"]), tiny_tokenizer_path, 384)
    assert collections.Counter(p.category for p in kept) == {"qa": 80, "writing": 10}
    with pytest.raises(ConfigError, match=r"workload.categories: poetry not in .*choose from writing, roleplay"):
        load_prompts(workload("specbench", path, categories=["poetry"]), tiny_tokenizer_path, 384)


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.integers(0, 9), min_size=1, max_size=6), num=st.integers(0, 40), seed=st.integers(0, 5))
def test_even_sampling_balances_categories_and_keeps_file_order(sizes, num, seed):
    items = [(c, i) for c, n in enumerate(sizes) for i in range(n)]
    chosen = sample_evenly(items, num, seed, category_of=lambda item: item[0])
    assert len(chosen) == min(num, len(items))
    assert chosen == sorted(chosen) and len(set(chosen)) == len(chosen) and set(chosen) <= set(items)
    counts = collections.Counter(c for c, _ in chosen)
    unexhausted = [counts[c] for c, n in enumerate(sizes) if n > counts[c]]
    if chosen and unexhausted:  # a category with questions left never has more than one fewer than any other
        assert max(counts.values()) - min(unexhausted) <= 1


@pytest.mark.parametrize(("name", "rows", "message"), [
    ("specbench", [{"question_id": 1, "category": "qa", "turns": ["x"]}, {"question_id": 2, "turns": ["y"]}],
     r"q.jsonl:2: missing field 'category' \(a specbench row needs turns, question_id, category\)"),
    ("mtbench", [{"question_id": 1, "category": "qa"}],
     r"q.jsonl:1: missing field 'turns' \(a mtbench row needs turns, question_id, category\)"),
    ("humaneval", [{"task_id": "H/0", "prompt": "def f():"}, {"prompt": "def g():"}],
     r"q.jsonl:2: missing field 'task_id' \(a humaneval row needs prompt, task_id\)"),
    ("gsm8k", [{"question": "1 + 1?"}, {"answer": "#### 2"}], r"q.jsonl:2: missing field 'question'"),
    ("specbench", [{"question_id": 1, "category": "qa", "turns": []}],
     r"q.jsonl:1: field 'turns' must be a string or a non-empty list of strings"),
    ("specbench", [{"question_id": 1, "category": "qa", "turns": ["a"]}, {"question_id": 1, "category": "qa",
                                                                          "turns": ["b"]}],
     r"q.jsonl:2: id '1' repeats line 1"),
])
def test_a_bad_row_names_the_file_the_line_and_the_field(tiny_tokenizer_path, tmp_path, name, rows, message):
    path = tmp_path / "q.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(ConfigError, match=message) as error:
        load_prompts(workload(name, path), tiny_tokenizer_path, 384)
    assert "\n" not in str(error.value)


def test_invalid_json_and_a_truncated_gzip_are_one_line_errors(tiny_tokenizer_path, tmp_path):
    path = tmp_path / "q.jsonl"
    path.write_text('{"question": "ok"}\n{"question": \n')
    with pytest.raises(ConfigError, match=r"q.jsonl:2: not valid JSON"):
        load_prompts(workload("gsm8k", path), tiny_tokenizer_path, 384)
    gz = tmp_path / "q.jsonl.gz"
    gz.write_bytes(gzip.compress(b'{"task_id": "a", "prompt": "def f():"}\n' * 50)[:40])
    with pytest.raises(ConfigError, match=r"q.jsonl.gz: cannot be read as gzipped JSON lines"):
        load_prompts(workload("humaneval", gz), tiny_tokenizer_path, 384)


def test_a_benchmark_workload_without_a_path_says_so(tiny_tokenizer_path):
    with pytest.raises(ConfigError, match="workload 'mtbench' has no path: set workload.path"):
        load_prompts(group_spec(WorkloadSpec, {"name": "mtbench"}), tiny_tokenizer_path, 384)


def test_jsonl_reads_named_fields_and_a_list_of_turns(tiny_tokenizer_path, tmp_path):
    path = tmp_path / "mine.jsonl"
    rows = [{"uid": "a", "kind": "chat", "text": ["hello", "and again"]}, {"uid": "b", "text": "single"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    spec = workload("jsonl", path, prompt_field="text", id_field="uid", category_field="kind")
    prompts = load_prompts(spec, tiny_tokenizer_path, 384)
    assert [(p.id, p.category, p.num_turns, p.text) for p in prompts] == [("a", "chat", 2, "hello"),
                                                                          ("b", None, 1, "single")]
    second = prompts[0].follow_up(["an answer"])
    assert (second.turn, second.text, second.request_id) == (2, "hello\n\nan answer\n\nand again", "a/turn2")
    assert prompts[1].follow_up([]) is None


def test_prompts_longer_than_max_prompt_tokens_are_left_out_with_a_notice(tiny_tokenizer_path, tmp_path, capsys):
    path = tmp_path / "q.jsonl"
    rows = [{"question": "short?"}, {"question": "a much longer question " * 20}, {"question": "tiny?"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    prompts = load_prompts(workload("gsm8k", path), tiny_tokenizer_path, 384, max_prompt_tokens=16)
    assert [p.id for p in prompts] == ["0", "2"]
    assert "1 of 3 prompts are longer than 16 tokens and are left out (gsm8k: 1)" in capsys.readouterr().err


def test_the_gsm8k_experiment_sweeps_k_0_to_8_on_held_out_test_questions(monkeypatch):
    from specexp.cli import compose_config

    monkeypatch.setenv("SPECEXP_DATA_DIR", "/data")
    cfg = compose_config(["+exp=gsm8k"], return_hydra_config=True)
    assert cfg.hydra.sweeper.params["speculator.num_speculative_tokens"] == "range(0,9)"
    assert (cfg.pair.name, cfg.workload.name, cfg.workload.chat_template) == ("tiny_gsm8k", "gsm8k", "auto")
    assert cfg.workload.path == "/data/gsm8k/test.jsonl" and cfg.engine.device == "cpu"


def run_cli(tmp_path, *overrides):
    import os
    import subprocess
    import sys

    env = {**os.environ, "SPECEXP_RUNS_DIR": str(tmp_path / "runs")}
    return subprocess.run([sys.executable, "-m", "specexp", "run", "pair=tiny_random", "tracking=disabled",
                           *overrides], capture_output=True, text=True, env=env, check=False)


def test_a_bad_question_file_stops_the_cli_with_one_line_and_exit_2(tmp_path):
    path = tmp_path / "q.jsonl"
    path.write_text(json.dumps({"question_id": 1, "category": "qa", "turns": ["x"]}) + "\n"
                    + json.dumps({"question_id": 2, "category": "qa"}) + "\n")
    done = run_cli(tmp_path, "workload=specbench", f"workload.path={path}", "workload.chat_template=none")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == (f"specexp: error: {path}:2: missing field 'turns' (a specbench"
                                                    " row needs turns, question_id, category)")
    assert not list((tmp_path / "runs").rglob("result.json")), "a config error found before the run creates no run"


def test_a_benchmark_workload_without_a_path_on_the_cli_names_the_key(tmp_path):
    done = run_cli(tmp_path, "workload=humaneval")
    assert done.returncode == 2 and "workload.path" in done.stderr and "Traceback" not in done.stderr
