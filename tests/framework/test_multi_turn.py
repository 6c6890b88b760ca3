"""Multi-turn questions: turn 2 runs as a second request of the conversation, its prompt the rendered chat with
the model's own turn-1 answer; both turns are counted, per category and per task, and both are in answers.jsonl."""

import json
import shutil

import pytest
from omegaconf import OmegaConf
from tokenizers import Tokenizer

from specexp.cli import compose_config
from specexp.experiment import RunContext, execute
from specexp.workloads.chat_template import load_chat_template
from specexp.workloads.conversation import PromptFormat, answer_text

TEMPLATE = ("{{ bos_token }}{% for m in messages %}{% if m.role == 'user' %}Q: {{ m.content }}\n"
            "{% elif m.role == 'assistant' %}A: {{ m.content }}{{ eos_token }}\n{% endif %}{% endfor %}"
            "{% if add_generation_prompt %}A:{% endif %}")
QUESTIONS = [
    {"question_id": 81, "category": "writing", "turns": ["Write a poem.", "Now shorter."]},
    {"question_id": 82, "category": "math", "turns": ["What is 2 + 2?", "And times 3?"]},
    {"question_id": 83, "category": "math", "turns": ["What is 5 - 1?", "Explain."]},
    {"question_id": 91, "category": "qa", "turns": ["Who wrote Hamlet?"]},
]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def chat_target(tiny_llama_dir, tmp_path_factory):
    """The tiny Llama target with a chat template in its tokenizer_config.json."""
    directory = tmp_path_factory.mktemp("chat-target") / "tiny-chat"
    shutil.copytree(tiny_llama_dir, directory)
    config = {"chat_template": TEMPLATE, "bos_token": "<bos>", "eos_token": "<eos>"}
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory


@pytest.fixture(scope="module")
def question_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("questions") / "question.jsonl"
    path.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
    return path


def run(tmp_path, target, draft, question_file, *extra, backend="native", name="run"):
    cfg = compose_config(["pair=local", f"pair.target.path={target}", f"pair.draft.path={draft}",
                          "workload=specbench", f"workload.path={question_file}", "sampling.max_new_tokens=10",
                          "speculator.num_speculative_tokens=3", "tracking=disabled", f"backend={backend}", *extra])
    run_dir = tmp_path / name
    record = execute(OmegaConf.to_container(cfg, resolve=True), RunContext(run_dir=run_dir, experiment="test"))
    assert record["status"] == "ok", record["error"]
    outputs = [json.loads(line) for line in (run_dir / "outputs.jsonl").read_text().splitlines()]
    answers = [json.loads(line) for line in (run_dir / "answers.jsonl").read_text().splitlines()]
    return record, outputs, answers


def test_turn_two_quotes_the_models_own_turn_one_answer(tmp_path, chat_target, tiny_llama_draft_dir, question_file):
    record, outputs, _ = run(tmp_path, chat_target, tiny_llama_draft_dir, question_file)
    assert [o["prompt_id"] for o in outputs] == ["81/turn1", "81/turn2", "82/turn1", "82/turn2", "83/turn1",
                                                 "83/turn2", "91"]
    tokenizer = Tokenizer.from_file(str(chat_target / "tokenizer.json"))
    fmt = PromptFormat(tokenizer, load_chat_template("auto", chat_target))
    by_id = {o["prompt_id"]: o for o in outputs}
    for question in QUESTIONS[:3]:
        first, second = by_id[f"{question['question_id']}/turn1"], by_id[f"{question['question_id']}/turn2"]
        answer = answer_text(tokenizer, first["output_token_ids"])
        expected = fmt.encode([{"role": "user", "content": question["turns"][0]},
                               {"role": "assistant", "content": answer},
                               {"role": "user", "content": question["turns"][1]}])
        assert (second["prompt"], tuple(second["prompt_token_ids"])) == expected
        assert (first["turn"], second["turn"], second["question_id"]) == (1, 2, str(question["question_id"]))
    assert record["metrics"]["num_requests"] == 7


def test_both_turns_are_counted_per_request_category_and_task(tmp_path, chat_target, tiny_llama_draft_dir,
                                                               question_file):
    record, outputs, _ = run(tmp_path, chat_target, tiny_llama_draft_dir, question_file)
    m = record["metrics"]
    assert set(m["acceptance_histogram_per_request"]) == {o["prompt_id"] for o in outputs}
    assert set(m["by_category"]) == {"writing", "math", "qa"}
    assert set(m["by_task"]) == {"mt_bench", "qa"}
    for level in ("by_category", "by_task"):
        groups = m[level].values()
        for key in ("num_drafts", "num_accepted_tokens", "num_output_tokens", "num_requests"):
            assert sum(g[key] for g in groups) == m[key], (level, key)
        assert [sum(g["acceptance_histogram"][j] for g in groups) for j in range(4)] == m["acceptance_histogram"]
    math = m["by_category"]["math"]
    assert (math["num_requests"], math["num_questions"]) == (4, 2)
    assert math["acceptance_length"] == 1 + math["num_accepted_tokens"] / math["num_drafts"]
    assert {"p50", "p90", "p99", "mean"} <= set(math["ttft_ms"]) and math["output_tokens_per_s"] > 0
    steps = [n for o in outputs for n in o["accept_lengths"]]
    assert m["spec_bench_mean_accepted_tokens"] == pytest.approx(sum(steps) / len(steps))


def test_answers_carry_both_turns_of_each_question(tmp_path, chat_target, tiny_llama_draft_dir, question_file):
    _, outputs, answers = run(tmp_path, chat_target, tiny_llama_draft_dir, question_file)
    assert [a["question_id"] for a in answers] == [81, 82, 83, 91]
    by_id = {o["prompt_id"]: o for o in outputs}
    choice = answers[0]["choices"][0]
    turns = [by_id["81/turn1"], by_id["81/turn2"]]
    assert choice["turns"] == [t["output_text"].strip() for t in turns]
    assert choice["new_tokens"] == [len(t["output_token_ids"]) for t in turns]
    assert choice["accept_lengths"] == turns[0]["accept_lengths"] + turns[1]["accept_lengths"]
    assert choice["wall_time"] == pytest.approx([(t["e2e_ms"] - (t.get("queue_ms") or 0.0)) / 1e3 for t in turns])
    assert len(answers[3]["choices"][0]["turns"]) == 1 and answers[1]["category"] == "math"


def test_hf_serves_the_same_two_turn_conversations_one_at_a_time(tmp_path, chat_target, tiny_llama_draft_dir,
                                                                  question_file):
    _, native, _ = run(tmp_path, chat_target, tiny_llama_draft_dir, question_file, name="native")
    _, hf, _ = run(tmp_path, chat_target, tiny_llama_draft_dir, question_file, backend="hf", name="hf")
    assert [(o["prompt_id"], o["prompt_token_ids"], o["output_token_ids"]) for o in hf] == \
        [(o["prompt_id"], o["prompt_token_ids"], o["output_token_ids"]) for o in native]


def test_one_at_a_time_serves_each_turn_alone_in_conversation_order(tmp_path, chat_target, tiny_llama_draft_dir,
                                                                    question_file):
    import pandas as pd

    record, alone, _ = run(tmp_path, chat_target, tiny_llama_draft_dir, question_file, "workload.one_at_a_time=true",
                           name="alone")
    _, batched, _ = run(tmp_path, chat_target, tiny_llama_draft_dir, question_file, name="batched")
    steps = pd.read_parquet(tmp_path / "alone" / "steps.parquet")
    assert set(steps["num_reqs"]) == {1} and list(steps["step"]) == list(range(len(steps)))
    assert [o["output_token_ids"] for o in alone] == [o["output_token_ids"] for o in batched]
    assert record["metrics"]["num_steps"] == len(steps)


def test_a_later_turn_that_does_not_fit_is_left_out_with_a_notice(tmp_path, chat_target, tiny_llama_draft_dir,
                                                                 question_file, capsys):
    long_turn = [{"question_id": 1, "category": "writing", "turns": ["Hi.", "word " * 60]}]
    path = tmp_path / "long.jsonl"
    path.write_text(json.dumps(long_turn[0]) + "\n")
    _, outputs, answers = run(tmp_path, chat_target, tiny_llama_draft_dir, path, "engine.max_model_len=48")
    assert [o["prompt_id"] for o in outputs] == ["1/turn1"] and len(answers[0]["choices"][0]["turns"]) == 1
    assert "1 later turns left out" in capsys.readouterr().err


@pytest.mark.parametrize("backend", ["native", "hf"])
def test_progress_counts_every_turn_of_every_conversation(tmp_path, chat_target, tiny_llama_draft_dir,
                                                          question_file, backend):
    import itertools

    from specexp.backends import get_backend
    from specexp.engine.progress import RUN
    from specexp.experiment import build_run_spec

    cfg = compose_config(["pair=local", f"pair.target.path={chat_target}", f"pair.draft.path={tiny_llama_draft_dir}",
                          "workload=specbench", f"workload.path={question_file}", "sampling.max_new_tokens=6",
                          "speculator.num_speculative_tokens=2", "tracking=disabled", f"backend={backend}"])
    spec = build_run_spec(OmegaConf.to_container(cfg, resolve=True), RunContext(run_dir=tmp_path, experiment="t"))
    events = []
    result = get_backend(backend).run(spec, progress=events.append)
    runs = [e for e in events if e.phase == RUN]
    assert {e.total for e in runs} == {7} and runs[0].done == 0 and runs[-1].done == 7
    assert all(a.done <= b.done and a.output_tokens <= b.output_tokens for a, b in itertools.pairwise(runs))
    assert runs[-1].output_tokens == sum(len(r.output_token_ids) for r in result.requests)
