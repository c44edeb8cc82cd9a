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

from typing import Optional

import numpy as np

from dysejax.config import ModelConfig, RopeScalingConfig
from dysejax.errors import ConfigError

DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float32"}  # float16 trains as float32
# transformers' hidden_act -> dysejax's activation (the same function, checked in tests/test_hf.py):
# transformers' gelu is the exact (erf) form; gelu_pytorch_tanh, gelu_new and gelu_fast the tanh one
ACTIVATIONS = {"silu": "silu", "swish": "silu", "gelu": "gelu_exact", "gelu_pytorch_tanh": "gelu",
               "gelu_new": "gelu", "gelu_fast": "gelu", "relu": "relu"}
EXPORTED_ACTIVATIONS = {"silu": "silu", "gelu_exact": "gelu", "gelu": "gelu_pytorch_tanh", "relu": "relu"}
MODEL_TYPES = ("llama", "mistral")
LLAMA3_FIELDS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


def _number(hf: dict, key: str, kind, default=None, where: str = "config.json"):
    """hf[key] as a positive int / float (`default` when absent or null); a ConfigError naming the field."""
    value = hf.get(key)
    if value is None:
        if default is None:
            raise ConfigError(f"{where} has no {key}: add it (this is not a complete Llama config.json)")
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and value != int(value)) \
            or value <= 0:
        need = "a positive integer" if kind is int else "a positive number"
        raise ConfigError(f"{where} {key} is {value!r}: it must be {need}")
    return kind(value)


def _rope(hf: dict) -> tuple[float, Optional[RopeScalingConfig]]:
    """(theta, scaling) from a Llama config: `rope_theta` + `rope_scaling`, or `rope_parameters`."""
    params = hf.get("rope_parameters") or {}
    if not isinstance(params, dict):
        raise ConfigError(f"config.json rope_parameters is {params!r}: it must be a mapping (or absent)")
    theta = _number({"rope_theta": params.get("rope_theta", hf.get("rope_theta"))}, "rope_theta", float, 10000.0)
    scaling = hf.get("rope_scaling") or params
    if not isinstance(scaling, dict):
        raise ConfigError(f"config.json rope_scaling is {scaling!r}: it must be a mapping (or null)")
    field = "rope_scaling" if hf.get("rope_scaling") else "rope_parameters"
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "default":
        return theta, None
    if kind not in ("linear", "llama3"):
        raise ConfigError(f"config.json {field} type {kind!r} is not supported (dysejax knows linear and llama3): "
                          "convert a model without it or with one of those")
    where = f"config.json {field} ({kind})"
    out = RopeScalingConfig(type=kind, factor=_number(scaling, "factor", float, where=where))
    if kind == "llama3":
        missing = [k for k in LLAMA3_FIELDS if scaling.get(k) is None]
        if missing:
            fallback = (f" (transformers falls back to max_position_embeddings={hf['max_position_embeddings']}: "
                        "add that if it is the pre-training context)"
                        if missing == ["original_max_position_embeddings"] and hf.get("max_position_embeddings")
                        else "")
            raise ConfigError(f"{where} has no {', '.join(missing)}: add the value{'s' if len(missing) > 1 else ''} "
                              f"the model was trained with{fallback}")
        out.low_freq_factor = _number(scaling, "low_freq_factor", float, where=where)
        out.high_freq_factor = _number(scaling, "high_freq_factor", float, where=where)
        out.original_max_position_embeddings = _number(scaling, "original_max_position_embeddings", int, where=where)
        if out.high_freq_factor <= out.low_freq_factor:
            raise ConfigError(f"{where} high_freq_factor ({out.high_freq_factor}) must exceed low_freq_factor "
                              f"({out.low_freq_factor}): fix the rope scaling")
    return theta, out


def _refusals(hf: dict) -> list[str]:
    """The fields of a Llama-family config.json that dysejax's Llama cannot run, as `field=value`."""
    arch = hf.get("model_type")
    if arch not in MODEL_TYPES:
        return [f"model_type={arch!r}"]
    return [f"{k}={hf[k]!r}" for k in ("attention_bias", "mlp_bias", "sliding_window") if hf.get(k)]


def model_config_from_hf(hf: dict) -> ModelConfig:
    """The dysejax model section of a Llama config.json (raises ConfigError for what we cannot run)."""
    refused = _refusals(hf)
    if refused:
        raise ConfigError(f"config.json {', '.join(refused)}: dysejax imports Llama-architecture models "
                          f"(model_type {' or '.join(MODEL_TYPES)}) without biases or sliding windows")
    act = hf.get("hidden_act", "silu")
    if act not in ACTIVATIONS:
        raise ConfigError(f"config.json hidden_act {act!r} is not supported: dysejax imports "
                          f"{', '.join(ACTIVATIONS)}")
    theta, scaling = _rope(hf)
    d_model = _number(hf, "hidden_size", int)
    n_heads = _number(hf, "num_attention_heads", int)
    n_kv = _number(hf, "num_key_value_heads", int, n_heads)
    if n_heads % n_kv:
        raise ConfigError(f"config.json num_attention_heads ({n_heads}) is not a multiple of num_key_value_heads "
                          f"({n_kv}): fix one of them")
    if hf.get("head_dim") is None and d_model % n_heads:
        raise ConfigError(f"config.json hidden_size ({d_model}) is not a multiple of num_attention_heads ({n_heads}) "
                          "and there is no head_dim: add head_dim")
    dtype = str(hf.get("torch_dtype") or hf.get("dtype") or "float32")
    if dtype not in DTYPES:
        raise ConfigError(f"config.json torch_dtype {dtype!r} is not supported: float32, bfloat16 or float16")
    tie = hf.get("tie_word_embeddings", False)
    if not isinstance(tie, bool):
        raise ConfigError(f"config.json tie_word_embeddings is {tie!r}: it must be true or false")
    return ModelConfig(
        n_layers=_number(hf, "num_hidden_layers", int), d_model=d_model, n_heads=n_heads, n_kv_heads=n_kv,
        head_dim=_number(hf, "head_dim", int, d_model // n_heads), d_ff=_number(hf, "intermediate_size", int),
        vocab_size=_number(hf, "vocab_size", int), mlp="gated", activation=ACTIVATIONS[act], tie_embeddings=tie,
        norm_eps=_number(hf, "rms_norm_eps", float, 1e-6), rope_theta=theta, rope_scaling=scaling,
        param_dtype=DTYPES[dtype])


def tensor_shapes(m: ModelConfig) -> dict[str, tuple[tuple[int, ...], str]]:
    """Every tensor of a Llama folder for model `m`: name -> (shape, the config.json fields giving it)."""
    D, H, G, K, F, V = (m.d_model, m.n_heads, m.n_kv_heads or m.n_heads, m.resolved_head_dim, m.resolved_d_ff,
                        m.vocab_size)
    d, q, kv, f, v = ("hidden_size", "num_attention_heads*head_dim", "num_key_value_heads*head_dim",
                      "intermediate_size", "vocab_size")
    out = {"model.embed_tokens.weight": ((V, D), f"[{v}, {d}]")}
    for i in range(m.n_layers):
        pre = f"model.layers.{i}."
        out.update({pre + "input_layernorm.weight": ((D,), f"[{d}]"),
                    pre + "self_attn.q_proj.weight": ((H * K, D), f"[{q}, {d}]"),
                    pre + "self_attn.k_proj.weight": ((G * K, D), f"[{kv}, {d}]"),
                    pre + "self_attn.v_proj.weight": ((G * K, D), f"[{kv}, {d}]"),
                    pre + "self_attn.o_proj.weight": ((D, H * K), f"[{d}, {q}]"),
                    pre + "post_attention_layernorm.weight": ((D,), f"[{d}]"),
                    pre + "mlp.gate_proj.weight": ((F, D), f"[{f}, {d}]"),
                    pre + "mlp.up_proj.weight": ((F, D), f"[{f}, {d}]"),
                    pre + "mlp.down_proj.weight": ((D, F), f"[{d}, {f}]")})
    out["model.norm.weight"] = ((D,), f"[{d}]")
    if not m.tie_embeddings:
        out["lm_head.weight"] = ((V, D), f"[{v}, {d}]")
    return out


def hf_config(m: ModelConfig, extra: dict) -> dict:
    """A Llama config.json for model section `m` (`extra`: fields kept from the import, e.g. token ids;
    its hidden_act is kept when it names the model's activation)."""
    if m.mlp != "gated":
        raise ConfigError("model.mlp is 'plain': a Llama config.json describes gated MLPs only (gate, up, down): "
                          "export a model trained with model.mlp: gated")
    act = extra.get("hidden_act")
    act = act if ACTIVATIONS.get(act) == m.activation else EXPORTED_ACTIVATIONS[m.activation]
    out = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": m.d_model,
           "intermediate_size": m.resolved_d_ff, "num_hidden_layers": m.n_layers, "num_attention_heads": m.n_heads,
           "num_key_value_heads": m.n_kv_heads or m.n_heads, "head_dim": m.resolved_head_dim,
           "hidden_act": act, "rms_norm_eps": m.norm_eps, "rope_theta": m.rope_theta,
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
