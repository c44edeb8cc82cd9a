"""Small Hugging Face Llama folders written with safetensors and json alone (no torch), in the
layout `LlamaForCausalLM.save_pretrained` writes: config.json + model.safetensors, [out, in]
matrices. Tests break them one way at a time."""
import json
import os

import numpy as np

CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 300, "hidden_size": 32,
          "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
          "head_dim": 6, "hidden_act": "silu", "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
          "max_position_embeddings": 64, "tie_word_embeddings": False, "torch_dtype": "float32"}


def llama_tensors(cfg: dict, dtype=np.float32) -> dict:
    """Random tensors of every weight `cfg` describes (head_dim 6: no matrix is square)."""
    rng = np.random.default_rng(0)
    D, F, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    K = cfg.get("head_dim") or D // cfg["num_attention_heads"]
    H, G = cfg["num_attention_heads"] * K, cfg["num_key_value_heads"] * K
    shapes = {"model.embed_tokens.weight": (V, D), "model.norm.weight": (D,)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes.update({p + "input_layernorm.weight": (D,), p + "post_attention_layernorm.weight": (D,),
                       p + "self_attn.q_proj.weight": (H, D), p + "self_attn.k_proj.weight": (G, D),
                       p + "self_attn.v_proj.weight": (G, D), p + "self_attn.o_proj.weight": (D, H),
                       p + "mlp.gate_proj.weight": (F, D), p + "mlp.up_proj.weight": (F, D),
                       p + "mlp.down_proj.weight": (D, F)})
    if not cfg.get("tie_word_embeddings"):
        shapes["lm_head.weight"] = (V, D)
    return {k: rng.normal(0, 0.1, s).astype(dtype) for k, s in shapes.items()}


def write_llama(folder, cfg: dict = None, tensors: dict = None) -> str:
    """Write config.json and model.safetensors into `folder` (created); returns it as a str."""
    from safetensors.numpy import save_file

    cfg = dict(CONFIG) if cfg is None else cfg
    tensors = llama_tensors(cfg) if tensors is None else tensors
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(cfg, f)
    save_file(tensors, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
    return str(folder)
