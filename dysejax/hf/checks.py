"""Every tensor of a Hugging Face Llama folder checked against its config.json before anything is
written: names (nothing missing, nothing unknown), shapes (a transposed matrix named as such,
the vocabulary against the embedding's rows), dtypes (readable, and cast to the model's
parameter dtype without rounding). Each problem is one `ConfigError` naming the file, the
tensor and the fix.

A square matrix (q_proj / o_proj when num_attention_heads*head_dim equals hidden_size,
gate/up/down when intermediate_size does) stored transposed has the right shape: no check on
shapes can tell, and the folder holds nothing else that could. Every matrix that the config
makes non-square is caught (tests/test_hf.py transposes each in turn).
"""
from __future__ import annotations

import re

import numpy as np

from dysejax.config import ModelConfig
from dysejax.errors import ConfigError
from dysejax.hf.files import DTYPES, SafetensorsFolder
from dysejax.hf.llama import tensor_shapes

# Kept by some older checkpoints; derived from the config, so not read.
IGNORED = re.compile(r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq")
SAME_DOCS = "use the config.json saved with these weights"


def _shape(shape) -> str:
    return "[" + ", ".join(map(str, shape)) + "]"


def _shape_error(name: str, have: tuple, want: tuple, fields: str, m: ModelConfig, file: str) -> str:
    """The message for tensor `name` of shape `have` where the config needs `want`."""
    if len(have) == 2 and have == want[::-1]:
        return (f"{file}: {name} is {_shape(have)}, the transpose of {fields} = {_shape(want)} that config.json "
                "gives: save it in torch.nn.Linear's [out_features, in_features] layout")
    if name in ("model.embed_tokens.weight", "lm_head.weight") and len(have) == 2 and have[1] == want[1]:
        return (f"{file}: {name} has {have[0]} rows but config.json vocab_size is {m.vocab_size}: set vocab_size "
                f"to {have[0]} (or {SAME_DOCS})")
    return (f"{file}: {name} is {_shape(have)}, config.json gives {fields} = {_shape(want)}: the weights and "
            f"config.json are of different models; {SAME_DOCS}")


def _missing(name: str, folder: str, m: ModelConfig) -> str:
    if name == "lm_head.weight":
        return (f"{folder!r} has no tensor lm_head.weight and config.json tie_word_embeddings is false: set "
                "tie_word_embeddings to true if the head shares the embedding")
    layer = re.match(r"model\.layers\.(\d+)\.", name)
    hint = f" (config.json num_hidden_layers is {m.n_layers})" if layer else ""
    return (f"{folder!r} has no tensor {name}{hint}: not a complete Llama checkpoint of this config.json; "
            f"{SAME_DOCS}")


def _unexpected(name: str, file: str, m: ModelConfig) -> str:
    layer = re.match(r"model\.layers\.(\d+)\.", name)
    if layer and int(layer.group(1)) >= m.n_layers:
        return (f"{file}: {name} is of layer {layer.group(1)} but config.json num_hidden_layers is {m.n_layers}: "
                f"set num_hidden_layers to the number of layers saved (or {SAME_DOCS})")
    if name.endswith(".bias"):
        return f"{file}: {name} is a bias, which dysejax's Llama has none of: import a model without biases"
    return (f"{file}: {name} is not a weight of a Llama model: import a Llama-architecture checkpoint (as "
            "LlamaForCausalLM.save_pretrained writes it)")


def check_tensors(tensors: SafetensorsFolder, m: ModelConfig) -> None:
    """Raise ConfigError for the first tensor of the folder that does not fit model `m` (from its
    config.json): missing, unknown, of the wrong shape or of a dtype that the import would round."""
    want = tensor_shapes(m)
    for name, (shape, fields) in want.items():
        if name not in tensors:
            raise ConfigError(_missing(name, tensors.folder, m))
        info = tensors.tensors[name]
        if info.dtype not in DTYPES:
            raise ConfigError(f"{info.file}: {name} is {info.dtype}; dysejax reads F32, BF16 and F16 weights: "
                              "save the model in one of those (e.g. torch_dtype float32)")
        if info.shape != shape:
            raise ConfigError(_shape_error(name, info.shape, shape, fields, m, info.file))
        if m.param_dtype == "bfloat16" and info.dtype != "BF16":
            raise ConfigError(f"{info.file}: {name} is {info.dtype} but config.json torch_dtype is bfloat16 (the "
                              "import would round it): set torch_dtype to float32 in config.json")
    for name, info in tensors.tensors.items():
        if name in want or IGNORED.fullmatch(name):
            continue
        if name == "lm_head.weight" and m.tie_embeddings:
            embed = tensors["model.embed_tokens.weight"]
            if info.shape == embed.shape and np.array_equal(tensors[name], embed):
                continue  # a tied head saved anyway
            raise ConfigError(f"{info.file}: lm_head.weight differs from model.embed_tokens.weight but config.json "
                              "tie_word_embeddings is true: set tie_word_embeddings to false")
        raise ConfigError(_unexpected(name, info.file, m))
