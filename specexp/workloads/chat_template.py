"""Chat templates: a checkpoint's Jinja template rendered exactly as transformers'
``tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)`` renders it.

The environment matches transformers 5's (``transformers.utils.chat_template_utils``): a sandboxed,
immutable Jinja environment with ``trim_blocks`` and ``lstrip_blocks`` on and the ``loopcontrols``
extension; the globals ``raise_exception(message)`` (raises, and here becomes a one-line error) and
``strftime_now(format)``; the ``tojson`` filter without HTML escaping (``ensure_ascii=False``,
optional ``indent``/``separators``/``sort_keys``); a ``{% generation %}...{% endgeneration %}`` block that
renders its body unchanged. The render variables are ``messages``, ``tools`` (None), ``documents`` (None),
``add_generation_prompt`` and the tokenizer's named special tokens from ``tokenizer_config.json``
(``bos_token``, ``eos_token``, ``unk_token``, ``sep_token``, ``pad_token``, ``cls_token``, ``mask_token``, and
the names of a dict-valued ``extra_special_tokens``), as plain strings.

Token ids are ``tokenizer.encode(rendered, add_special_tokens=False).ids``, as transformers tokenizes a
rendered chat: the template writes BOS itself, so the post-processor must not add another.

Where a template comes from (``workload.chat_template``): ``auto`` — the checkpoint's
``chat_template.jinja`` if present, else ``tokenizer_config.json``'s ``chat_template`` (a string, or a list
of ``{name, template}`` of which ``default`` is used), which is transformers' order; ``none``; or a path to a
``.jinja`` file (or to a ``tokenizer_config.json`` holding one).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from functools import lru_cache
from pathlib import Path

from specexp.errors import ConfigError

NAMED_SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
TEMPLATE_FILE = "chat_template.jinja"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
SETTINGS = ("auto", "none")


class ChatTemplateError(ConfigError):
    """A template that does not compile, or that raised (``raise_exception``) while rendering."""


@dataclass(frozen=True)
class ChatTemplate:
    """A compiled-on-demand chat template. ``source``: where it was read (for messages);
    ``special_tokens``: ``{name: token string}`` passed to the template (``bos_token`` ...)."""

    template: str
    source: str
    special_tokens: dict[str, str] = field(default_factory=dict)

    def render(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        """The template applied to ``messages`` (``[{"role", "content"}, ...]``), as
        ``apply_chat_template(messages, add_generation_prompt=..., tokenize=False)`` returns it."""
        import jinja2

        compiled = _compile(self.template, self.source)
        try:
            return compiled.render(messages=messages, tools=None, documents=None,
                                   add_generation_prompt=add_generation_prompt, **self.special_tokens)
        except jinja2.TemplateError as e:
            raise ChatTemplateError(f"chat template {self.source} failed: {_first_line(e)}") from None

    def encode(self, tokenizer, messages: list[dict], add_generation_prompt: bool = True) -> tuple[str, tuple[int, ...]]:
        """``(rendered text, token ids)`` of ``messages`` with ``tokenizer`` (a ``tokenizers.Tokenizer``);
        ids as transformers' ``apply_chat_template(..., tokenize=True)`` gives them."""
        text = self.render(messages, add_generation_prompt)
        return text, tuple(tokenizer.encode(text, add_special_tokens=False).ids)


def _first_line(error: Exception) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


@lru_cache(maxsize=16)
def _compile(template: str, source: str):
    """The template compiled in transformers' environment (cached per template text)."""
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        # Jinja's own tojson escapes HTML characters; transformers' (and so every template's author) does not.
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(format):
        return datetime.now().strftime(format)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[_generation_block_class(), jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    try:
        return env.from_string(template)
    except jinja2.TemplateSyntaxError as e:
        raise ChatTemplateError(f"chat template {source} does not compile (line {e.lineno}): {e.message}") from None


def _generation_block_class():
    import jinja2.ext
    import jinja2.nodes

    class _GenerationBlock(jinja2.ext.Extension):
        """``{% generation %}body{% endgeneration %}`` renders ``body``: transformers uses the block to mark
        assistant tokens for training masks, which rendering a prompt does not need."""

        tags = frozenset({"generation"})

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    return _GenerationBlock


# ------------------------------------------------------------------------------------------------ loading


def _token_string(value) -> str | None:
    """A special token as tokenizer_config.json stores it: a string or an AddedToken dict."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    return None


def special_tokens(tokenizer_config: dict) -> dict[str, str]:
    """The named special tokens a template sees (transformers' ``special_tokens_map``)."""
    tokens = {}
    for name in NAMED_SPECIAL_TOKENS:
        value = _token_string(tokenizer_config.get(name))
        if value is not None:
            tokens[name] = value
    # transformers 5 also names model-specific tokens: a dict-valued extra_special_tokens, other top-level
    # "*_token" keys, and model_specific_special_tokens (later ones win).
    extra = tokenizer_config.get("extra_special_tokens")
    named = dict(extra) if isinstance(extra, dict) else {}
    named.update({k: v for k, v in tokenizer_config.items() if k.endswith("_token") and k not in NAMED_SPECIAL_TOKENS})
    explicit = tokenizer_config.get("model_specific_special_tokens")
    named.update(explicit if isinstance(explicit, dict) else {})
    for name, value in named.items():
        value = _token_string(value)
        if value is not None:
            tokens[name] = value
    return tokens


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise ConfigError(f"{path} is not readable JSON ({_first_line(e)})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path} is not a JSON object")
    return data


def _template_from_config(config: dict, path: Path) -> str | None:
    template = config.get("chat_template")
    if template is None or isinstance(template, str):
        return template
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        if "default" in named:
            return named["default"]
        raise ConfigError(f"{path} has chat templates {sorted(map(str, named))} but none named 'default':"
                          " set workload.chat_template to a template file")
    raise ConfigError(f"{path}: chat_template is a {type(template).__name__}, expected a string")


def load_chat_template(setting: str | None, model_dir: str | Path | None) -> ChatTemplate | None:
    """The template ``workload.chat_template`` names for the checkpoint in ``model_dir`` (its special tokens
    come from its tokenizer_config.json). ``None`` for ``none``, and for ``auto`` when the checkpoint ships no
    template. :class:`ConfigError` for a path that does not exist or holds no template."""
    setting = "none" if setting is None else str(setting)
    if setting == "none":
        return None
    model_dir = Path(model_dir) if model_dir is not None else None
    config_path = model_dir / TOKENIZER_CONFIG_FILE if model_dir is not None else None
    config = _read_json(config_path) if config_path is not None and config_path.is_file() else {}
    tokens = special_tokens(config)
    if setting == "auto":
        if model_dir is not None and (model_dir / TEMPLATE_FILE).is_file():
            path = model_dir / TEMPLATE_FILE
            return ChatTemplate(path.read_text(encoding="utf-8"), str(path), tokens)
        template = _template_from_config(config, config_path) if config else None
        return ChatTemplate(template, str(config_path), tokens) if template is not None else None
    path = Path(setting).expanduser()
    if not path.is_file():
        raise ConfigError(f"workload.chat_template={setting}: no such file; use auto, none or a .jinja file")
    if path.suffix == ".json":
        template = _template_from_config(_read_json(path), path)
        if template is None:
            raise ConfigError(f"workload.chat_template={setting}: {path.name} has no chat_template")
        return ChatTemplate(template, str(path), tokens)
    return ChatTemplate(path.read_text(encoding="utf-8"), str(path), tokens)
