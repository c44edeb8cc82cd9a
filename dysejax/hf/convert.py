"""`import`: a Hugging Face Llama folder -> a dysejax workdir; `export`: a workdir -> a folder
`transformers` loads.

An import writes into an empty (or new) workdir W:
  W/config.yaml   the model (from config.json), the model's tokenizer, `plan: auto`, and
                  `train.init_from: W/hf_params` so `train.py --config W/config.yaml --workdir W`
                  continues training the imported weights;
  W/hf_params/    the parameters (orbax), values unchanged;
  W/tokenizer/    the model's tokenizer files (when it has any);
  W/hf_import.json  the original config.json (its other fields are written back on export).
An export takes the latest training checkpoint of W (or the imported parameters when there is
none) and writes config.json + model.safetensors (+ the tokenizer files) into a new folder.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
from typing import Optional

import numpy as np
import yaml

from dysejax.checkpoint import read_numpy, save_params
from dysejax.config import Config, ModelConfig, config_from_dict, load_config
from dysejax.errors import ConfigError
from dysejax.hf.llama import hf_config, hf_from_params, model_config_from_hf, params_from_hf, read_config, read_safetensors

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "special_tokens_map.json")


def _empty_or_new(path: str, flag: str) -> None:
    if os.path.isfile(path):
        raise ConfigError(f"{flag} {path!r} is a file: name a new or empty folder")
    if os.path.isdir(path) and os.listdir(path):
        raise ConfigError(f"{flag} {path!r} is not empty: name a new or empty folder (nothing was overwritten)")


def _as_dtype(a: np.ndarray, name: str) -> np.ndarray:
    import ml_dtypes

    dtype = np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(name)
    return a if a.dtype == dtype else a.astype(dtype)


def _plain(model: ModelConfig) -> dict:
    return {k: v for k, v in dataclasses.asdict(model).items() if v is not None}


def import_model(hf_dir: str, workdir: str, buckets: Optional[list[int]] = None) -> str:
    """Convert the Llama folder `hf_dir` into `workdir` (see the module docstring); returns the
    config path."""
    hf = read_config(hf_dir)
    model = model_config_from_hf(hf)
    _empty_or_new(workdir, "--workdir")
    tensors = read_safetensors(hf_dir)
    params = {k: _as_dtype(v, model.param_dtype) for k, v in params_from_hf(tensors, model).items()}
    workdir = os.path.abspath(workdir)
    os.makedirs(workdir, exist_ok=True)
    try:
        save_params(os.path.join(workdir, "hf_params"), params)
        data = {"source": "stdlib", "documents": "blocks", "buckets": buckets or [128, 256, 512],
                "long_policy": "split", "tokenizer": "bytes"}
        found = [f for f in TOKENIZER_FILES if os.path.isfile(os.path.join(hf_dir, f))]
        if found:
            os.makedirs(os.path.join(workdir, "tokenizer"))
            for f in found:
                shutil.copy2(os.path.join(hf_dir, f), os.path.join(workdir, "tokenizer", f))
            data["tokenizer"] = os.path.join(workdir, "tokenizer")
        config = {"model": _plain(model), "data": data,
                  "train": {"init_from": os.path.join(workdir, "hf_params")},
                  "parallel": {"plan": "auto"}}
        config_from_dict(config)  # what we write must load
        path = os.path.join(workdir, "config.yaml")
        with open(path, "w") as f:
            f.write(f"# Imported from {os.path.abspath(hf_dir)} by python -m dysejax.hf import\n")
            yaml.safe_dump(config, f, sort_keys=False)
        with open(os.path.join(workdir, "hf_import.json"), "w") as f:
            json.dump({"source": os.path.abspath(hf_dir), "config": hf}, f, indent=1)
    except BaseException:
        shutil.rmtree(workdir, ignore_errors=True)
        raise
    return path


def _latest_step(workdir: str) -> Optional[int]:
    folder = os.path.join(workdir, "checkpoints")
    steps = [int(d) for d in os.listdir(folder) if d.isdigit()] if os.path.isdir(folder) else []
    return max(steps) if steps else None


def _params_and_model(workdir: str, step: Optional[int]) -> tuple[dict, ModelConfig, str]:
    """(numpy params, model config, what they are) of a workdir's checkpoint or import."""
    step = _latest_step(workdir) if step is None else step
    if step is not None:
        where = os.path.join(workdir, "checkpoints", str(step))
        if not os.path.isdir(where):
            raise ConfigError(f"{workdir!r} has no checkpoint of step {step}: see {workdir}/checkpoints")
        with open(os.path.join(where, "meta", "metadata")) as f:
            model = config_from_dict({"model": json.load(f)["model"]}).model
        return read_numpy(os.path.join(where, "state"))["params"], model, f"checkpoint step {step}"
    config_path = os.path.join(workdir, "config.yaml")
    if not os.path.isdir(os.path.join(workdir, "hf_params")) or not os.path.isfile(config_path):
        raise ConfigError(f"{workdir!r} holds neither a training checkpoint nor an import: pass the --workdir "
                          "of a run or of `python -m dysejax.hf import`")
    config: Config = load_config(config_path)
    return read_numpy(os.path.join(workdir, "hf_params")), config.model, "the imported parameters"


def export_model(workdir: str, out_dir: str, step: Optional[int] = None) -> str:
    """Write the workdir's latest (or `step`'s) parameters as a Llama folder `out_dir`; returns
    a description of what was exported."""
    from safetensors.numpy import save_file

    workdir = os.path.abspath(workdir)
    params, model, what = _params_and_model(workdir, step)
    _empty_or_new(out_dir, "the output folder")
    imported = {}
    if os.path.isfile(os.path.join(workdir, "hf_import.json")):
        with open(os.path.join(workdir, "hf_import.json")) as f:
            imported = json.load(f)["config"]
    config = hf_config(model, imported)
    dtype = str(imported.get("torch_dtype") or imported.get("dtype") or model.param_dtype)
    tensors = {k: _as_dtype(np.asarray(v), dtype) for k, v in hf_from_params(params, model).items()}
    config["torch_dtype"] = dtype
    os.makedirs(out_dir, exist_ok=True)
    save_file(tensors, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    for name in TOKENIZER_FILES:
        src = os.path.join(workdir, "tokenizer", name)
        if os.path.isfile(src):
            shutil.copy2(src, os.path.join(out_dir, name))
    return what
