"""Reading a Hugging Face model folder: config.json and the *.safetensors files, every read error
one line (`ConfigError`) naming the file and the fix.

safetensors validates each file's header (truncated and garbage files are refused there); the
tensors are then read through the header's byte offsets with `np.memmap`, because safetensors'
numpy reader has no bfloat16 (ml_dtypes gives numpy one).
"""
from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass

import ml_dtypes
import numpy as np

from dysejax.errors import ConfigError

# safetensors dtype names -> numpy dtypes of the weights an import reads
DTYPES = {"F32": np.dtype(np.float32), "BF16": np.dtype(ml_dtypes.bfloat16), "F16": np.dtype(np.float16)}
INDEX = "model.safetensors.index.json"


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return (text[:160] + "...") if len(text) > 160 else text


def read_json(path: str, fix: str) -> dict:
    """A JSON object from `path` (`fix`: what the messages tell the user to do)."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path} is not valid JSON ({e.msg} at line {e.lineno} column {e.colno}): {fix}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path} cannot be read ({_one_line(e)}): {fix}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path} holds a JSON {type(data).__name__}, not an object: {fix}")
    return data


def read_config(folder: str) -> dict:
    """config.json of a Hugging Face model folder."""
    if not os.path.isdir(folder):
        raise ConfigError(f"{folder!r} is not a folder: point at a Hugging Face model folder (config.json + "
                          "*.safetensors)")
    path = os.path.join(folder, "config.json")
    if not os.path.isfile(path):
        raise ConfigError(f"{folder!r} has no config.json: point at a Hugging Face model folder")
    return read_json(path, "fix config.json or save the model again (save_pretrained)")


@dataclass(frozen=True)
class TensorInfo:
    file: str  # path of the .safetensors file holding it
    dtype: str  # safetensors' name: F32, BF16, ...
    shape: tuple[int, ...]
    offset: int  # of the first byte in the file


def _header(path: str) -> dict:
    """The parsed header of a safetensors file (after safetensors itself has validated it)."""
    from safetensors import SafetensorError, safe_open

    fix = "download or save the model again (save_pretrained(..., safe_serialization=True))"
    try:
        with safe_open(path, framework="numpy"):
            pass
        with open(path, "rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(size))
    except (SafetensorError, OSError, ValueError) as e:
        raise ConfigError(f"{path} is not a readable safetensors file ({_one_line(e)}): {fix}") from None
    header.pop("__metadata__", None)
    return {name: TensorInfo(path, h["dtype"], tuple(h["shape"]), 8 + size + h["data_offsets"][0])
            for name, h in header.items()}


def _weight_files(folder: str) -> list[str]:
    """The files holding the weights: those the index names, else model.safetensors, else every
    *.safetensors (some folders also ship the weights in another layout, e.g. consolidated.safetensors)."""
    index = os.path.join(folder, INDEX)
    if os.path.isfile(index):
        weight_map = read_json(index, f"fix {INDEX} or save the model again").get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise ConfigError(f"{index} has no weight_map: fix it or save the model again")
        files = sorted(set(map(str, weight_map.values())))
        missing = [f for f in files if not os.path.isfile(os.path.join(folder, f))]
        if missing:
            raise ConfigError(f"{index} names {missing[0]}, which {folder!r} does not hold: download the missing "
                              "shard")
        return files
    if os.path.isfile(os.path.join(folder, "model.safetensors")):
        return ["model.safetensors"]
    files = sorted(f for f in os.listdir(folder) if f.endswith(".safetensors"))
    if not files:
        raise ConfigError(f"{folder!r} has no *.safetensors files: save the model with "
                          "save_pretrained(..., safe_serialization=True)")
    return files


class SafetensorsFolder:
    """The tensors of a model folder's weight files: names, dtypes and shapes from the headers,
    values read on demand."""

    def __init__(self, folder: str):
        self.folder = folder
        self.tensors: dict[str, TensorInfo] = {}
        for f in _weight_files(folder):
            for name, info in _header(os.path.join(folder, f)).items():
                if name in self.tensors:
                    raise ConfigError(f"{info.file} and {self.tensors[name].file} both hold {name}: keep one "
                                      "copy of each tensor")
                self.tensors[name] = info

    def __contains__(self, name: str) -> bool:
        return name in self.tensors

    def __getitem__(self, name: str) -> np.ndarray:
        info = self.tensors[name]
        dtype = DTYPES[info.dtype]  # the checks refuse other dtypes before anything is read
        try:
            return np.array(np.memmap(info.file, dtype=dtype, mode="r", offset=info.offset, shape=info.shape))
        except (OSError, ValueError) as e:
            raise ConfigError(f"{info.file}: {name} cannot be read ({_one_line(e)}): download or save the model "
                              "again") from None
