"""Rope settings are read as transformers reads them, so ``native`` and ``hf`` compute the same model.

transformers 5 takes a truthy ``rope_scaling`` over ``rope_parameters`` (the whole dict), and fills a
missing ``rope_theta`` from the top-level ``rope_theta``, then from the model class's default. Each
combination below is built by transformers and by the native loader: the rotary frequencies must be equal,
and a rope type the native engine does not implement is refused with the supported list.
"""

from __future__ import annotations

import itertools
import json

import pytest
import torch

from specexp.models.config import SUPPORTED_ROPE_TYPES, ModelConfig, UnsupportedModelError
from specexp.models.layers import rope_inv_freq

ROPE_PARAMETERS = {
    "absent": None,
    "empty": {},
    "default": {"rope_type": "default", "rope_theta": 500000.0},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64, "rope_theta": 500000.0},
}
ROPE_SCALING = {
    "absent": None,
    "null": "null",
    "llama3": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 2.0,
               "original_max_position_embeddings": 128},
    "llama3-legacy-type": {"type": "llama3", "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0},
    "default-with-theta": {"rope_type": "default", "rope_theta": 250000.0},
    "linear": {"type": "linear", "factor": 2.0},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
}
ROPE_THETA = {"absent": None, "top-level": 200000.0}
MODEL_TYPES = ("llama", "qwen2", "qwen3", "lfm2")


def hf_config_dict(model_type: str, rope_parameters, rope_scaling, rope_theta) -> dict:
    config = {"model_type": model_type, "vocab_size": 64, "hidden_size": 64, "intermediate_size": 128,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
              "max_position_embeddings": 256}
    if model_type == "lfm2":
        config["layer_types"] = ["conv", "full_attention"]
    if rope_parameters is not None:
        config["rope_parameters"] = rope_parameters
    if rope_scaling is not None:
        config["rope_scaling"] = None if rope_scaling == "null" else rope_scaling
    if rope_theta is not None:
        config["rope_theta"] = rope_theta
    return json.loads(json.dumps(config))  # as read from a config.json: fresh dicts, no shared state


def transformers_rope(config: dict):
    """(rope_type, inv_freq, attention_scaling) as transformers computes them for ``config``."""
    from transformers import AutoConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    hf = AutoConfig.for_model(**json.loads(json.dumps(config)))
    params = hf.rope_parameters
    rope_type = params["rope_type"]
    if rope_type == "default":
        from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

        inv_freq, scaling = LlamaRotaryEmbedding.compute_default_rope_parameters(hf)
    else:
        inv_freq, scaling = ROPE_INIT_FUNCTIONS[rope_type](hf, "cpu")
    return rope_type, inv_freq.float(), scaling


@pytest.mark.parametrize(("model_type", "parameters", "scaling", "theta"), [
    *itertools.product(["llama"], ROPE_PARAMETERS, ROPE_SCALING, ROPE_THETA),
    *itertools.product(["qwen2", "qwen3", "lfm2"], ["absent", "default"], ["absent", "default-with-theta"],
                       ROPE_THETA),
])
def test_native_reads_rope_settings_as_transformers_does(model_type, parameters, scaling, theta):
    config = hf_config_dict(model_type, ROPE_PARAMETERS[parameters], ROPE_SCALING[scaling], ROPE_THETA[theta])
    rope_type, hf_inv_freq, hf_scaling = transformers_rope(config)
    if rope_type not in SUPPORTED_ROPE_TYPES:
        with pytest.raises(UnsupportedModelError) as info:
            ModelConfig.from_hf(config, "ckpt")
        message = str(info.value)
        assert f"rope_type '{rope_type}'" in message and all(t in message for t in SUPPORTED_ROPE_TYPES), message
        return
    native = ModelConfig.from_hf(config, "ckpt")
    assert native.rope.rope_type == rope_type
    assert hf_scaling == 1.0
    torch.testing.assert_close(rope_inv_freq(native.rope, native.head_dim), hf_inv_freq, rtol=1e-6, atol=0)


def test_an_unsupported_rope_type_names_the_file_and_the_supported_types():
    config = hf_config_dict("llama", None, ROPE_SCALING["yarn"], None)
    with pytest.raises(UnsupportedModelError, match=r"ckpt/config.json: rope_type 'yarn' is not implemented "
                                                    r"by the native engine \(supported: default, llama3\)"):
        ModelConfig.from_hf(config, "ckpt/config.json")
