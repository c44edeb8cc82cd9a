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
from dysejax.config import BYTE_VOCAB, Config, ModelConfig, config_from_dict, load_config
from dysejax.errors import CheckpointError, ConfigError
from dysejax.hf.checks import check_tensors
from dysejax.hf.files import SafetensorsFolder, read_config, read_json
from dysejax.hf.llama import hf_config, hf_from_params, model_config_from_hf, params_from_hf

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


def _remove_written(path: str, existed: bool) -> None:
    """Undo a failed write into `path`: remove it, or empty it again when it existed (empty) before."""
    if not existed:
        shutil.rmtree(path, ignore_errors=True)
        return
    for name in os.listdir(path):
        p = os.path.join(path, name)
        shutil.rmtree(p, ignore_errors=True) if os.path.isdir(p) and not os.path.islink(p) else os.remove(p)


def import_model(hf_dir: str, workdir: str, buckets: Optional[list[int]] = None) -> str:
    """Convert the Llama folder `hf_dir` into `workdir` (see the module docstring); returns the
    config path. Every tensor is checked against config.json first (`dysejax.hf.checks`): a
    problem is a one-line ConfigError and nothing is written."""
    hf = read_config(hf_dir)
    model = model_config_from_hf(hf)
    _empty_or_new(workdir, "--workdir")
    tensors = SafetensorsFolder(hf_dir)
    check_tensors(tensors, model)
    workdir = os.path.abspath(workdir)
    found = [f for f in TOKENIZER_FILES if os.path.isfile(os.path.join(hf_dir, f))]
    data = {"source": "stdlib", "documents": "blocks", "buckets": buckets or [128, 256, 512],
            "long_policy": "split", "tokenizer": os.path.join(workdir, "tokenizer") if found else "bytes"}
    config = {"model": _plain(model), "data": data, "train": {"init_from": os.path.join(workdir, "hf_params")},
              "parallel": {"plan": "auto"}}
    if not found and model.vocab_size < BYTE_VOCAB:
        raise ConfigError(f"{hf_dir!r} has no tokenizer ({' or '.join(TOKENIZER_FILES[::2])}) and config.json "
                          f"vocab_size {model.vocab_size} is below the {BYTE_VOCAB} ids of byte tokens: put the "
                          "model's tokenizer files in the folder")
    config_from_dict(config)  # what we write must load
    params = {k: _as_dtype(v, model.param_dtype) for k, v in params_from_hf(tensors, model).items()}
    existed = os.path.isdir(workdir)
    os.makedirs(workdir, exist_ok=True)
    try:
        save_params(os.path.join(workdir, "hf_params"), params)
        if found:
            os.makedirs(os.path.join(workdir, "tokenizer"))
            for f in found:
                shutil.copy2(os.path.join(hf_dir, f), os.path.join(workdir, "tokenizer", f))
        path = os.path.join(workdir, "config.yaml")
        with open(path, "w") as f:
            f.write(f"# Imported from {os.path.abspath(hf_dir)} by python -m dysejax.hf import\n")
            yaml.safe_dump(config, f, sort_keys=False)
        with open(os.path.join(workdir, "hf_import.json"), "w") as f:
            json.dump({"source": os.path.abspath(hf_dir), "config": hf}, f, indent=1)
    except BaseException:
        _remove_written(workdir, existed)
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
        meta = read_json(os.path.join(where, "meta", "metadata"), "export another --step")
        if not isinstance(meta.get("model"), dict):
            raise CheckpointError(f"{where} has no model in its metadata: export another --step")
        model = config_from_dict({"model": meta["model"]}).model
        state = read_numpy(os.path.join(where, "state"))
        if not isinstance(state, dict) or "params" not in state:
            raise CheckpointError(f"{where} holds no parameters: export another --step")
        return state["params"], model, f"checkpoint step {step}"
    config_path = os.path.join(workdir, "config.yaml")
    if not os.path.isdir(os.path.join(workdir, "hf_params")) or not os.path.isfile(config_path):
        raise ConfigError(f"{workdir!r} holds neither a training checkpoint nor an import: pass the --workdir "
                          "of a run or of `python -m dysejax.hf import`")
    config: Config = load_config(config_path)
    return read_numpy(os.path.join(workdir, "hf_params")), config.model, "the imported parameters"


def _check_params(params: dict, model: ModelConfig, what: str) -> None:
    """Raise CheckpointError unless `params` has exactly the names and shapes of `model`'s."""
    import flax.linen as nn
    import jax

    from dysejax.model.transformer import init_params

    want = jax.eval_shape(lambda: nn.unbox(init_params(model, jax.random.key(0))))
    for name in sorted(set(want) | set(params)):
        have = tuple(np.shape(params[name])) if name in params else "missing"
        need = tuple(want[name].shape) if name in want else "absent"
        if have != need:
            raise CheckpointError(f"{what}: parameter {name} is {have}, the model of its config needs {need}: "
                                  "export with the config that trained (or imported) these parameters")


def export_model(workdir: str, out_dir: str, step: Optional[int] = None) -> str:
    """Write the workdir's latest (or `step`'s) parameters as a Llama folder `out_dir`; returns
    a description of what was exported. Nothing is written when anything is wrong."""
    from safetensors.numpy import save_file

    workdir = os.path.abspath(workdir)
    _empty_or_new(out_dir, "the output folder")
    imported = {}
    if os.path.isfile(os.path.join(workdir, "hf_import.json")):
        record = read_json(os.path.join(workdir, "hf_import.json"), "restore it from the imported model's config.json")
        imported = record.get("config") if isinstance(record.get("config"), dict) else {}
    params, model, what = _params_and_model(workdir, step)
    config = hf_config(model, imported)
    _check_params(params, model, f"{workdir} ({what})")
    dtype = str(imported.get("torch_dtype") or imported.get("dtype") or model.param_dtype)
    if dtype not in ("float32", "bfloat16", "float16"):
        dtype = model.param_dtype
    tensors = {k: _as_dtype(np.asarray(v), dtype) for k, v in hf_from_params(params, model).items()}
    config["torch_dtype"] = dtype
    existed = os.path.isdir(out_dir)
    os.makedirs(out_dir, exist_ok=True)
    try:
        save_file(tensors, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
        with open(os.path.join(out_dir, "config.json"), "w") as f:
            json.dump(config, f, indent=1)
        for name in TOKENIZER_FILES:
            src = os.path.join(workdir, "tokenizer", name)
            if os.path.isfile(src):
                shutil.copy2(src, os.path.join(out_dir, name))
    except BaseException:
        _remove_written(out_dir, existed)
        raise
    return what
