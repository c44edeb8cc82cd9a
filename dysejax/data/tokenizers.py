"""Tokenizers from files, and a byte-level BPE trained on the corpus.

`data.tokenizer` names one of:
  * `bytes` — UTF-8 bytes (`dysejax.data.tokenizer.ByteTokenizer`);
  * `bpe` — a byte-level BPE trained with the `tokenizers` library on the training documents at
    `model.vocab_size` tokens (deterministic; cached in the workdir, keyed by corpus and size);
  * a Hugging Face `tokenizers` JSON file (`tokenizer.json`), its BOS/EOS read from a
    `tokenizer_config.json` beside it, else found by their usual names;
  * a sentencepiece model (`*.model`; needs the `sentencepiece` package);
  * a Hugging Face model directory: its `tokenizer.json`, else its `tokenizer.model`.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterable, Optional

import numpy as np

from dysejax.data.tokenizer import ByteTokenizer, Tokenizer
from dysejax.errors import DataError

EOS_NAMES = ("</s>", "<|endoftext|>", "<|end_of_text|>", "<eos>", "<|eot_id|>", "<|im_end|>")
BOS_NAMES = ("<s>", "<|begin_of_text|>", "<bos>", "<|startoftext|>")
PAD_NAMES = ("<pad>", "<|pad|>", "[PAD]", "<|finetune_right_pad_id|>")
BPE_SPECIALS = ("<pad>", "<s>", "</s>")  # ids 0, 1, 2 of a trained BPE


def _special(value) -> Optional[str]:
    """A tokenizer_config.json special-token entry (a string or {"content": ...})."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


class HFTokenizer(Tokenizer):
    """A Hugging Face `tokenizers` Tokenizer (a tokenizer.json), specials added by us."""

    def __init__(self, path: str, tokenizer=None, config: Optional[dict] = None):
        from tokenizers import Tokenizer as _Tok

        self.path, self.name = str(path), str(path)
        try:
            self.tok = tokenizer if tokenizer is not None else _Tok.from_file(self.path)
        except Exception as e:  # the library raises plain Exceptions for malformed files
            raise DataError(f"data.tokenizer {self.path!r} is not a tokenizers JSON file ({_one_line(e)}): "
                            "point it at a tokenizer.json, a *.model, a model folder, or use bpe / bytes") from None
        self.vocab_size = self.tok.get_vocab_size(with_added_tokens=True)
        config = config or {}
        eos, bos, pad = (self._id(_special(config.get(key)), names)
                         for key, names in (("eos_token", EOS_NAMES), ("bos_token", BOS_NAMES), ("pad_token", PAD_NAMES)))
        if eos is None:
            raise DataError(f"data.tokenizer {self.path!r} defines no end-of-text token (looked for "
                            f"{', '.join(EOS_NAMES)}): add one, or give a tokenizer_config.json with eos_token beside it")
        self.eos_id = eos
        self.bos_id = bos if config.get("add_bos_token", True) else None
        self.pad_id = pad if pad is not None else eos

    def _id(self, configured: Optional[str], names) -> Optional[int]:
        for name in ([configured] if configured else []) + list(names):
            i = self.tok.token_to_id(name)
            if i is not None:
                return int(i)
        return None

    def encode_batch(self, texts):
        encode = getattr(self.tok, "encode_batch_fast", self.tok.encode_batch)  # fast: no character offsets
        return [np.asarray(e.ids, dtype=np.int32) for e in encode(list(texts), add_special_tokens=False)]

    def decode(self, ids) -> str:
        return self.tok.decode([int(i) for i in np.asarray(ids).reshape(-1)], skip_special_tokens=True)

    def identity(self) -> bytes:
        return json.dumps([self.tok.to_str(), self.bos_id, self.eos_id, self.pad_id]).encode()


class SentencePieceTokenizer(Tokenizer):
    """A sentencepiece model (`*.model`), its BOS/EOS/PAD as the model defines them."""

    def __init__(self, path: str):
        try:
            import sentencepiece
        except ImportError:
            raise DataError(f"data.tokenizer {path!r} is a sentencepiece model: pip install sentencepiece "
                            "(or dysejax[sentencepiece])") from None
        self.path, self.name = str(path), str(path)
        try:
            self.sp = sentencepiece.SentencePieceProcessor(model_file=self.path)
        except Exception as e:
            raise DataError(f"data.tokenizer {self.path!r} is not a sentencepiece model ({_one_line(e)}): "
                            "point it at a valid *.model file") from None
        self.vocab_size = int(self.sp.get_piece_size())
        if self.sp.eos_id() < 0:
            raise DataError(f"sentencepiece model {self.path!r} defines no EOS id: train it with eos_id >= 0")
        self.eos_id = int(self.sp.eos_id())
        self.bos_id = int(self.sp.bos_id()) if self.sp.bos_id() >= 0 else None
        self.pad_id = int(self.sp.pad_id()) if self.sp.pad_id() >= 0 else self.eos_id

    def encode_batch(self, texts):
        return [np.asarray(ids, dtype=np.int32) for ids in self.sp.encode(list(texts))]

    def decode(self, ids) -> str:
        return self.sp.decode([int(i) for i in np.asarray(ids).reshape(-1)])

    def identity(self) -> bytes:
        return Path(self.path).read_bytes()


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return text[:160] + ("..." if len(text) > 160 else "")


def from_model_dir(path: Path) -> Tokenizer:
    """The tokenizer of a Hugging Face model directory (tokenizer.json, else tokenizer.model)."""
    config_file = path / "tokenizer_config.json"
    config = json.loads(config_file.read_text()) if config_file.is_file() else {}
    if (path / "tokenizer.json").is_file():
        return HFTokenizer(str(path / "tokenizer.json"), config=config)
    if (path / "tokenizer.model").is_file():
        return SentencePieceTokenizer(str(path / "tokenizer.model"))
    raise DataError(f"data.tokenizer {str(path)!r} is a folder without tokenizer.json or tokenizer.model: "
                    "point it at a Hugging Face model folder or a tokenizer file")


def open_tokenizer(spec: str) -> Tokenizer:
    """The tokenizer `spec` names: `bytes` or a file / model folder (not `bpe`: see `train_bpe`)."""
    if spec == "bytes":
        return ByteTokenizer()
    path = Path(os.path.expanduser(spec))
    if path.is_dir():
        return from_model_dir(path)
    if not path.is_file():
        raise DataError(f"data.tokenizer {spec!r} is neither bytes, bpe, nor an existing tokenizer file or model "
                        "folder: fix the path or use bpe")
    if path.suffix == ".model":
        return SentencePieceTokenizer(str(path))
    config_file = path.parent / "tokenizer_config.json"
    config = json.loads(config_file.read_text()) if config_file.is_file() else {}
    return HFTokenizer(str(path), config=config)


# ---------------------------------------------------------------------------------------------
# A byte-level BPE trained on the corpus
# ---------------------------------------------------------------------------------------------
def bpe_file(cache_dir: str, corpus_fingerprint: str, vocab_size: int, sample_bytes: int) -> str:
    """Where the BPE trained on this corpus at this size is cached."""
    return os.path.join(cache_dir, f"bpe-{vocab_size}-{sample_bytes}-{corpus_fingerprint}.json")


def train_bpe(texts: Iterable[str], vocab_size: int, path: str) -> HFTokenizer:
    """Train a byte-level BPE of `vocab_size` tokens (specials <pad>, <s>, </s> first) on `texts`
    and save it to `path` (atomically). Deterministic for the same texts in the same order."""
    from tokenizers import Tokenizer as _Tok, decoders, models, pre_tokenizers, trainers

    if vocab_size < 256 + len(BPE_SPECIALS):
        raise DataError(f"model.vocab_size ({vocab_size}) is too small for a byte-level BPE: "
                        f"use at least {256 + len(BPE_SPECIALS)}")
    tok = _Tok(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(BPE_SPECIALS), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    tok.save(tmp)
    os.replace(tmp, path)
    return HFTokenizer(path)


def cached_bpe(path: str) -> Optional[HFTokenizer]:
    """The BPE saved at `path`, or None if it was never trained."""
    return HFTokenizer(path) if os.path.isfile(path) else None
