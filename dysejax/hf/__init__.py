"""Hugging Face interop: Llama-architecture models in and out (`python -m dysejax.hf`).

    python -m dysejax.hf import HF_DIR --workdir W     # W/config.yaml, W/hf_params, W/tokenizer
    python train.py --config W/config.yaml --workdir W  # continue training (plan: auto)
    python -m dysejax.hf export --workdir W OUT_DIR     # config.json + model.safetensors

Modules: `files` (reading config.json and safetensors, each read error one line), `llama`
(config and tensor mapping), `checks` (every tensor's name, shape and dtype against config.json
before anything is written), `convert` (the import and export of workdirs). Reading needs
`safetensors`; `transformers` is not needed (tests use it, from the `hf` extra, to check the
numbers).
"""
from dysejax.hf.convert import export_model, import_model
from dysejax.hf.llama import hf_from_params, model_config_from_hf, params_from_hf

__all__ = ["import_model", "export_model", "model_config_from_hf", "params_from_hf", "hf_from_params"]
