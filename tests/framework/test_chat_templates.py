"""Chat templates render and tokenize exactly as transformers' ``apply_chat_template(..., add_generation_prompt=True)``
on templates of the common shapes (Llama-3 headers, ChatML as Qwen writes it, LFM2's), one and two turns."""

import json
import shutil

import pytest
from tokenizers import AddedToken, Tokenizer

from specexp.errors import ConfigError
from specexp.specs import WorkloadSpec, group_spec
from specexp.workloads import load_prompts
from specexp.workloads.chat_template import load_chat_template
from specexp.workloads.conversation import Conversation, PromptFormat

LLAMA3 = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
    " + message['content'] | trim + '<|eot_id|>' %}"
    "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)
QWEN_CHATML = """{%- if messages[0]['role'] == 'system' %}
    {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
{%- else %}
    {{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant") %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""
# LFM2's shape: BOS, ChatML turns, tools as JSON in the system turn; with trim_blocks/lstrip_blocks whitespace.
LFM2 = """{{- bos_token -}}
{%- set system_prompt = "" -%}
{%- set ns = namespace(system_prompt="") -%}
{%- if messages[0]["role"] == "system" -%}
    {%- set ns.system_prompt = messages[0]["content"] -%}
    {%- set messages = messages[1:] -%}
{%- endif -%}
{%- if tools -%}
    {%- set ns.system_prompt = ns.system_prompt + ("\\n" if ns.system_prompt else "") + "List of tools: " + (tools | tojson) -%}
{%- endif -%}
{%- if ns.system_prompt -%}
    {{- "<|im_start|>system\\n" + ns.system_prompt + "<|im_end|>\\n" -}}
{%- endif -%}
{%- for message in messages -%}
    {{- "<|im_start|>" + message["role"] + "\\n" -}}
    {%- set content = message["content"] -%}
    {%- if content is not string -%}
        {%- set content = content | tojson -%}
    {%- endif -%}
    {{- content + "<|im_end|>\\n" -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- "<|im_start|>assistant\\n" -}}
{%- endif -%}
"""
# Raises on a role other than user/assistant; a block statement on its own line (trim/lstrip matter), a
# {% generation %} block, loop controls and transformers' tojson (no HTML escaping, non-ASCII kept).
STRICT = """{{ bos_token }}
{% for message in messages %}
    {% if message['role'] not in ['user', 'assistant'] %}
        {{ raise_exception('roles must be user or assistant, got ' + message['role']) }}
    {% endif %}
    {% if message['role'] == 'assistant' %}
[A] {% generation %}{{ message['content'] }}{% endgeneration %}{{ eos_token }}
    {% else %}
[U] {{ message['content'] }} {{ {'meta': '<b>café</b>', 'n': loop.index} | tojson }}
    {% endif %}
    {% if loop.index > 8 %}{% break %}{% endif %}
{% endfor %}
{% if add_generation_prompt %}
[A]{% endif %}"""

SHAPES = {
    "llama3": (LLAMA3, {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
               ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]),
    "qwen_chatml": (QWEN_CHATML, {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
                    ["<|im_start|>", "<|im_end|>", "<|endoftext|>"]),
    "lfm2": (LFM2, {"bos_token": "<|startoftext|>", "eos_token": "<|im_end|>", "pad_token": "<|pad|>"},
             ["<|startoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>"]),
    "strict": (STRICT, {"bos_token": "<bos>", "eos_token": "<eos>"}, []),
}
ONE_TURN = [{"role": "user", "content": "What is 12 * 7?  "}]
WITH_SYSTEM = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a prime."}]
TWO_TURNS = [{"role": "user", "content": "Write a haiku about caches."},
             {"role": "assistant", "content": "Blocks fill, then evict —\nthe hot lines stay near."},
             {"role": "user", "content": "Now rewrite it in French, please."}]


def checkpoint_dir(root, tiny_tokenizer_path, shape):
    """A directory with tokenizer.json (the shape's special tokens added) and tokenizer_config.json."""
    template, special, added = SHAPES[shape]
    directory = root / shape
    directory.mkdir()
    tokenizer = Tokenizer.from_file(str(tiny_tokenizer_path))
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in added])
    tokenizer.save(str(directory / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "chat_template": template, **special}
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory


@pytest.fixture(scope="module", params=sorted(SHAPES))
def shape_dir(request, tmp_path_factory, tiny_tokenizer_path):
    return checkpoint_dir(tmp_path_factory.mktemp("templates"), tiny_tokenizer_path, request.param)


def transformers_ids(directory, messages):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    return text, tuple(ids)


@pytest.mark.parametrize("messages", [ONE_TURN, TWO_TURNS], ids=["one_turn", "two_turns"])
def test_rendering_and_token_ids_equal_transformers(shape_dir, messages):
    template = load_chat_template("auto", shape_dir)
    ours = template.encode(Tokenizer.from_file(str(shape_dir / "tokenizer.json")), messages)
    assert ours == transformers_ids(shape_dir, messages)


def test_a_system_prompt_renders_as_transformers_does(tmp_path, tiny_tokenizer_path):
    for shape in ("llama3", "qwen_chatml", "lfm2"):
        directory = checkpoint_dir(tmp_path, tiny_tokenizer_path, shape)
        template = load_chat_template("auto", directory)
        ours = template.encode(Tokenizer.from_file(str(directory / "tokenizer.json")), WITH_SYSTEM)
        assert ours == transformers_ids(directory, WITH_SYSTEM), shape
        assert "You are terse." in ours[0]


def test_special_tokens_of_the_template_are_single_ids(tmp_path, tiny_tokenizer_path):
    directory = checkpoint_dir(tmp_path, tiny_tokenizer_path, "llama3")
    tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
    _, ids = load_chat_template("auto", directory).encode(tokenizer, ONE_TURN)
    header = [tokenizer.token_to_id(t) for t in ("<|begin_of_text|>", "<|start_header_id|>")]
    assert list(ids[:2]) == header and ids.count(tokenizer.token_to_id("<|begin_of_text|>")) == 1, \
        "one BOS, written by the template; none added by the post-processor"


def test_a_template_that_raises_on_a_bad_role_is_a_one_line_error_like_transformers(tmp_path, tiny_tokenizer_path):
    from jinja2.exceptions import TemplateError
    from transformers import AutoTokenizer

    directory = checkpoint_dir(tmp_path, tiny_tokenizer_path, "strict")
    messages = [{"role": "narrator", "content": "Once"}]
    with pytest.raises(TemplateError, match="roles must be user or assistant, got narrator"):
        AutoTokenizer.from_pretrained(str(directory)).apply_chat_template(messages, add_generation_prompt=True)
    with pytest.raises(ConfigError, match=r"chat template .*tokenizer_config.json failed: roles must be user or"
                                          r" assistant, got narrator$"):
        load_chat_template("auto", directory).render(messages)


def test_the_second_turn_quotes_the_first_answer_exactly_as_transformers_renders_it(tmp_path, tiny_tokenizer_path):
    directory = checkpoint_dir(tmp_path, tiny_tokenizer_path, "qwen_chatml")
    tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
    fmt = PromptFormat(tokenizer, load_chat_template("auto", directory), system_prompt="You are terse.")
    conversation = Conversation("q1", (TWO_TURNS[0]["content"], TWO_TURNS[2]["content"]), "writing", "mt_bench", fmt)
    first = conversation.prompt(1, [])
    second = first.follow_up([TWO_TURNS[1]["content"]])
    messages = [{"role": "system", "content": "You are terse."}, *TWO_TURNS]
    assert (second.text, second.token_ids) == transformers_ids(directory, messages)
    assert (first.text, first.token_ids) == transformers_ids(directory, messages[:2])
    assert (second.turn, second.request_id, second.follow_up(["x", "y"])) == (2, "q1/turn2", None)


def test_a_workload_applies_the_checkpoints_template_and_system_prompt(tmp_path, tiny_tokenizer_path):
    directory = checkpoint_dir(tmp_path, tiny_tokenizer_path, "lfm2")
    path = tmp_path / "q.jsonl"
    path.write_text(json.dumps({"question": "How many legs do 3 spiders have?"}) + "\n")
    spec = group_spec(WorkloadSpec, {"name": "gsm8k", "path": str(path), "chat_template": "auto",
                                     "system_prompt": "Think step by step."})
    (prompt,) = load_prompts(spec, directory / "tokenizer.json", 400, model_dir=directory)
    messages = [{"role": "system", "content": "Think step by step."},
                {"role": "user", "content": "How many legs do 3 spiders have?"}]
    assert (prompt.text, prompt.token_ids) == transformers_ids(directory, messages)


def test_chat_template_jinja_wins_over_tokenizer_config_as_in_transformers(tmp_path, tiny_tokenizer_path):
    directory = checkpoint_dir(tmp_path, tiny_tokenizer_path, "lfm2")
    (directory / "chat_template.jinja").write_text(QWEN_CHATML)
    template = load_chat_template("auto", directory)
    assert template.source.endswith("chat_template.jinja")
    assert template.encode(Tokenizer.from_file(str(directory / "tokenizer.json")), ONE_TURN) == \
        transformers_ids(directory, ONE_TURN)


def test_template_settings_none_path_named_list_and_missing(tmp_path, tiny_tokenizer_path):
    directory = checkpoint_dir(tmp_path, tiny_tokenizer_path, "llama3")
    assert load_chat_template("none", directory) is None
    file = tmp_path / "mine.jinja"
    file.write_text(LFM2)
    from_file = load_chat_template(str(file), directory)
    assert from_file.template == LFM2 and from_file.special_tokens["bos_token"] == "<|begin_of_text|>"
    config = json.loads((directory / "tokenizer_config.json").read_text())
    config["chat_template"] = [{"name": "tool_use", "template": QWEN_CHATML}, {"name": "default", "template": LLAMA3}]
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    assert load_chat_template("auto", directory).template == LLAMA3
    with pytest.raises(ConfigError, match=r"workload.chat_template=.*nope.jinja: no such file; use auto, none"):
        load_chat_template(str(tmp_path / "nope.jinja"), directory)
    bare = tmp_path / "bare"
    bare.mkdir()
    shutil.copy(directory / "tokenizer.json", bare / "tokenizer.json")
    assert load_chat_template("auto", bare) is None


def test_auto_without_a_template_gives_raw_text_and_one_notice(tmp_path, tiny_tokenizer_path, capsys):
    path = tmp_path / "q.jsonl"
    path.write_text(json.dumps({"question": "2 + 2?"}) + "\n")
    spec = group_spec(WorkloadSpec, {"name": "gsm8k", "path": str(path), "chat_template": "auto"})
    (prompt,) = load_prompts(spec, tiny_tokenizer_path, 384)
    assert prompt.token_ids == tuple(Tokenizer.from_file(str(tiny_tokenizer_path)).encode("2 + 2?").ids)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "ships no chat template" in err[0] and "prompts are raw text" in err[0]


def test_a_template_that_does_not_compile_names_its_line(tmp_path, tiny_tokenizer_path):
    bad = tmp_path / "bad.jinja"
    bad.write_text("{{ bos_token }}\n{% for m in messages %}{{ m.content }}\n")
    with pytest.raises(ConfigError, match=r"bad.jinja does not compile \(line \d\)"):
        load_chat_template(str(bad), None).render(ONE_TURN)
