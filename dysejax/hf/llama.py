"""Llama-architecture checkpoints in Hugging Face layout <-> dysejax model config and parameters.

Hugging Face keeps a Llama as config.json + safetensors with [out, in] matrices per layer:
  model.embed_tokens.weight [V, D]; per layer i, model.layers.i.:
    input_layernorm.weight [D]; self_attn.{q,k,v,o}_proj.weight [H*K, D], [G*K, D], [G*K, D], [D, H*K];
    post_attention_layernorm.weight [D]; mlp.{gate,up,down}_proj.weight [F, D], [F, D], [D, F];
  model.norm.weight [D]; lm_head.weight [V, D] (absent when tied).
dysejax stacks layers and keeps [in, out] blocks with named head axes (`Transformer`):
  wq [L, D, H, K], wkv [L, D, 2, G, K], wo [L, H, K, D], w_in [L, D, 2 (gate, up), F], w_out [L, F, D].
Both use rotate-half rotary embeddings, RMSNorm in float32 and 1/sqrt(K) attention scaling, so
the mapping is transposes and reshapes only: values are never changed, and a round trip through
`params_from_hf` and `hf_from_params` is bit-exact.
"""
from __future__ import annotations

import json
import os
from typing import Optional

import numpy as np

from dysejax.config import ModelConfig, RopeScalingConfig
from dysejax.errors import ConfigError

DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float32"}  # float16 trains as float32


def _rope(hf: dict) -> tuple[float, Optional[RopeScalingConfig]]:
    """(theta, scaling) from a Llama config: `rope_theta` + `rope_scaling`, or `rope_parameters`."""
    params = hf.get("rope_parameters") or {}
    theta = float(params.get("rope_theta", hf.get("rope_theta", 10000.0)))
    scaling = hf.get("rope_scaling") or (params if params.get("rope_type", "default") != "default" else None)
    if not scaling:
        return theta, None
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind not in ("linear", "llama3"):
        raise ConfigError(f"rope scaling {kind!r} is not supported (dysejax knows linear and llama3): "
                          "convert a model without it or with one of those")
    out = RopeScalingConfig(type=kind, factor=float(scaling["factor"]))
    if kind == "llama3":
        out.low_freq_factor = float(scaling["low_freq_factor"])
        out.high_freq_factor = float(scaling["high_freq_factor"])
        out.original_max_position_embeddings = int(scaling["original_max_position_embeddings"])
    return theta, out


def model_config_from_hf(hf: dict) -> ModelConfig:
    """The dysejax model section of a Llama config.json (raises ConfigError for what we cannot run)."""
    arch = hf.get("model_type")
    if arch not in ("llama", "mistral") or hf.get("attention_bias") or hf.get("mlp_bias") or hf.get("sliding_window"):
        raise ConfigError(f"config.json describes a {arch!r} model (attention_bias={hf.get('attention_bias')}, "
                          f"mlp_bias={hf.get('mlp_bias')}, sliding_window={hf.get('sliding_window')}): dysejax imports "
                          "Llama-architecture models without biases or sliding windows")
    act = hf.get("hidden_act", "silu")
    if act not in ("silu", "gelu", "relu"):
        raise ConfigError(f"config.json hidden_act {act!r} is not supported: silu, gelu or relu")
    theta, scaling = _rope(hf)
    n_heads = int(hf["num_attention_heads"])
    dtype = str(hf.get("torch_dtype") or hf.get("dtype") or "float32")
    return ModelConfig(
        n_layers=int(hf["num_hidden_layers"]), d_model=int(hf["hidden_size"]), n_heads=n_heads,
        n_kv_heads=int(hf.get("num_key_value_heads") or n_heads),
        head_dim=int(hf.get("head_dim") or hf["hidden_size"] // n_heads), d_ff=int(hf["intermediate_size"]),
        vocab_size=int(hf["vocab_size"]), mlp="gated", activation=act,
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)), norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        rope_theta=theta, rope_scaling=scaling, param_dtype=DTYPES.get(dtype, "float32"))


def hf_config(m: ModelConfig, extra: dict) -> dict:
    """A Llama config.json for model section `m` (`extra`: fields kept from the import, e.g. token ids)."""
    out = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": m.d_model,
           "intermediate_size": m.resolved_d_ff, "num_hidden_layers": m.n_layers, "num_attention_heads": m.n_heads,
           "num_key_value_heads": m.n_kv_heads or m.n_heads, "head_dim": m.resolved_head_dim,
           "hidden_act": m.activation, "rms_norm_eps": m.norm_eps, "rope_theta": m.rope_theta,
           "tie_word_embeddings": m.tie_embeddings, "vocab_size": m.vocab_size, "attention_bias": False,
           "mlp_bias": False, "torch_dtype": m.param_dtype}
    if m.rope_scaling is not None:
        r = m.rope_scaling
        out["rope_scaling"] = {"rope_type": r.type, "factor": r.factor}
        if r.type == "llama3":
            out["rope_scaling"].update(low_freq_factor=r.low_freq_factor, high_freq_factor=r.high_freq_factor,
                                       original_max_position_embeddings=r.original_max_position_embeddings)
    kept = {k: v for k, v in extra.items() if k not in ("rope_scaling", "rope_parameters", "dtype", "torch_dtype")}
    return {**kept, **out}


def params_from_hf(tensors, m: ModelConfig) -> dict:
    """dysejax parameters (numpy, as stored) from Hugging Face tensors (`tensors[name]` -> array)."""
    L, D, H, G, K, F = m.n_layers, m.d_model, m.n_heads, m.n_kv_heads or m.n_heads, m.resolved_head_dim, m.resolved_d_ff

    def layers(name, fn):
        return np.stack([fn(tensors[f"model.layers.{i}.{name}"]) for i in range(L)])

    def both(i, a, b, shape):
        return np.stack([tensors[f"model.layers.{i}.{a}"].T.reshape(shape),
                         tensors[f"model.layers.{i}.{b}"].T.reshape(shape)], axis=1)

    params = {
        "embed": tensors["model.embed_tokens.weight"],
        "final_norm": tensors["model.norm.weight"],
        "layers_attn_norm": layers("input_layernorm.weight", lambda w: w),
        "layers_wq": layers("self_attn.q_proj.weight", lambda w: w.T.reshape(D, H, K)),
        "layers_wkv": np.stack([both(i, "self_attn.k_proj.weight", "self_attn.v_proj.weight", (D, G, K))
                                for i in range(L)]),
        "layers_wo": layers("self_attn.o_proj.weight", lambda w: w.T.reshape(H, K, D)),
        "layers_mlp_norm": layers("post_attention_layernorm.weight", lambda w: w),
        "layers_w_in": np.stack([both(i, "mlp.gate_proj.weight", "mlp.up_proj.weight", (D, F)) for i in range(L)]),
        "layers_w_out": layers("mlp.down_proj.weight", lambda w: w.T),
    }
    if not m.tie_embeddings:
        params["lm_head"] = tensors["lm_head.weight"].T
    return {k: np.ascontiguousarray(v) for k, v in params.items()}


def hf_from_params(params: dict, m: ModelConfig) -> dict:
    """Hugging Face tensors ([out, in] matrices per layer) from dysejax parameters (numpy)."""
    L, D, H, G, K = m.n_layers, m.d_model, m.n_heads, m.n_kv_heads or m.n_heads, m.resolved_head_dim
    out = {"model.embed_tokens.weight": params["embed"], "model.norm.weight": params["final_norm"]}
    for i in range(L):
        pre = f"model.layers.{i}."
        out[pre + "input_layernorm.weight"] = params["layers_attn_norm"][i]
        out[pre + "self_attn.q_proj.weight"] = params["layers_wq"][i].reshape(D, H * K).T
        out[pre + "self_attn.k_proj.weight"] = params["layers_wkv"][i][:, 0].reshape(D, G * K).T
        out[pre + "self_attn.v_proj.weight"] = params["layers_wkv"][i][:, 1].reshape(D, G * K).T
        out[pre + "self_attn.o_proj.weight"] = params["layers_wo"][i].reshape(H * K, D).T
        out[pre + "post_attention_layernorm.weight"] = params["layers_mlp_norm"][i]
        out[pre + "mlp.gate_proj.weight"] = params["layers_w_in"][i][:, 0].T
        out[pre + "mlp.up_proj.weight"] = params["layers_w_in"][i][:, 1].T
        out[pre + "mlp.down_proj.weight"] = params["layers_w_out"][i].T
    if not m.tie_embeddings:
        out["lm_head.weight"] = params["lm_head"].T
    return {k: np.ascontiguousarray(v) for k, v in out.items()}


def read_safetensors(folder: str):
    """A lazy name -> numpy array mapping over a folder's *.safetensors files."""
    from safetensors import safe_open

    files = sorted(f for f in os.listdir(folder) if f.endswith(".safetensors"))
    if not files:
        raise ConfigError(f"{folder!r} has no *.safetensors files: export the model with safe_serialization=True")
    where = {}
    for f in files:
        with safe_open(os.path.join(folder, f), framework="numpy") as st:
            where.update({name: f for name in st.keys()})

    class Tensors:
        def __getitem__(self, name):
            if name not in where:
                raise ConfigError(f"{folder!r} has no tensor {name!r}: not a Llama-architecture checkpoint")
            with safe_open(os.path.join(folder, where[name]), framework="numpy") as st:
                return st.get_tensor(name)

    return Tensors()


def read_config(folder: str) -> dict:
    """config.json of a Hugging Face model folder."""
    path = os.path.join(folder, "config.json")
    if not os.path.isfile(path):
        raise ConfigError(f"{folder!r} has no config.json: point at a Hugging Face model folder")
    with open(path) as f:
        return json.load(f)
