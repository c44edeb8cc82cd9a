"""Tokenizers (`data.tokenizer`): trained BPE, tokenizers JSON, sentencepiece, model folders; the
token cache; the vocabulary check. Every tokenizer here is built in the test (no network)."""
import json
import os

import numpy as np
import pytest

import dysejax
from dysejax.config import DataConfig
from dysejax.data import DataPipeline
from dysejax.data.corpus import open_corpus
from dysejax.data.token_cache import TokenCache
from dysejax.data.tokenizers import open_tokenizer, train_bpe
from dysejax.errors import ConfigError, DataError
from tests.conftest import FAST, TINY

WORDS = ("alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma tau "
         "upsilon phi chi psi omega").split()


def _text_folder(root, n=40, seed=0):
    """A folder of n small UTF-8 text files of pseudo-random words."""
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        words = rng.choice(WORDS, size=int(rng.integers(20, 120)))
        (root / f"doc{i:03d}.txt").write_text(" ".join(words) + "\n")
    return root


def _texts(n=200):
    rng = np.random.default_rng(1)
    return [" ".join(rng.choice(WORDS, size=30)) for _ in range(n)]


def test_bpe_training_is_deterministic(tmp_path):
    a = train_bpe(iter(_texts()), 300, str(tmp_path / "a.json"))
    b = train_bpe(iter(_texts()), 300, str(tmp_path / "b.json"))
    assert (tmp_path / "a.json").read_bytes() == (tmp_path / "b.json").read_bytes()
    assert a.vocab_size == 300 and a.fingerprint() == b.fingerprint()
    assert (a.tok.token_to_id("<pad>"), a.bos_id, a.eos_id) == (0, 1, 2)
    [doc] = a.documents(["alpha beta gamma"])
    assert doc[0] == a.bos_id and doc[-1] == a.eos_id and len(doc) < 2 + len("alpha beta gamma")
    assert a.decode(doc) == "alpha beta gamma"


def test_pipeline_trains_bpe_once_and_caches_tokens(tmp_path):
    folder = _text_folder(tmp_path / "corpus")
    cfg = DataConfig(source="text", path=str(folder), tokenizer="bpe", buckets=[64, 128], tokens_per_batch=512,
                     eval_fraction=0.1)
    logs = []
    first = DataPipeline(cfg, cache_dir=str(tmp_path / "cache"), vocab_size=300, log=logs.append)
    assert [m.split(":")[0] for m in logs] == ["tokenizer", "token cache"]
    logs.clear()
    again = DataPipeline(cfg, cache_dir=str(tmp_path / "cache"), vocab_size=300, log=logs.append)
    assert logs == []  # neither retrained nor retokenised
    assert np.array_equal(first.source.lengths, again.source.lengths)
    # every document is [BOS] + its text's ids + EOS, and decodes back to the file
    tok, src = again.tokenizer, again.source
    for i in (0, len(src.keys) - 1):
        ids = src.read(i, 0, int(src.lengths[i]))
        assert ids[0] == tok.bos_id and ids[-1] == tok.eos_id
        assert tok.decode(ids) == (folder / src.keys[i]).read_text()
    batch = next(again.train_iterator())
    assert (batch.inputs[batch.segment_ids == 0] == tok.pad_id).all() and batch.inputs.max() < 300
    # a changed file: a new cache (the BPE too: it was trained on the old corpus), the old one removed
    (folder / "doc000.txt").write_text("omega omega omega\n")
    changed = DataPipeline(cfg, cache_dir=str(tmp_path / "cache"), vocab_size=300, log=logs.append)
    assert [m.split(":")[0] for m in logs] == ["tokenizer", "token cache"]
    caches = [d for d in os.listdir(tmp_path / "cache") if d.startswith("tokens-")]
    assert caches == [os.path.basename(changed.source.path)]


def test_tokenizers_json_sentencepiece_and_model_folder(tmp_path):
    texts = _texts()
    # a tokenizers JSON with its own special names, configured by a tokenizer_config.json beside it
    folder = tmp_path / "model"
    folder.mkdir()
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=280, special_tokens=["[BEGIN]", "[END]"],
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                       show_progress=False))
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"bos_token": "[BEGIN]", "eos_token": {"content": "[END]"}}))
    for spec in (folder, folder / "tokenizer.json"):
        t = open_tokenizer(str(spec))
        assert (t.bos_id, t.eos_id, t.pad_id, t.vocab_size) == (0, 1, 1, 280)
        [doc] = t.documents(["beta gamma"])
        assert doc[0] == 0 and doc[-1] == 1 and t.decode(doc) == "beta gamma"
    # without the config there is no EOS the names can find: a one-line error
    os.remove(folder / "tokenizer_config.json")
    with pytest.raises(DataError, match=r"defines no end-of-text token \(looked for </s>, "):
        open_tokenizer(str(folder / "tokenizer.json"))
    # sentencepiece, trained here
    spm = pytest.importorskip("sentencepiece")
    (tmp_path / "corpus.txt").write_text("\n".join(texts))
    spm.SentencePieceTrainer.train(input=str(tmp_path / "corpus.txt"), model_prefix=str(tmp_path / "sp"),
                                   vocab_size=60, model_type="bpe", minloglevel=2)
    sp = open_tokenizer(str(tmp_path / "sp.model"))
    assert (sp.bos_id, sp.eos_id, sp.vocab_size) == (1, 2, 60)
    [doc] = sp.documents(["beta gamma"])
    assert doc[0] == 1 and doc[-1] == 2 and sp.decode(doc) == "beta gamma"


def test_jsonl_streams_into_the_token_cache(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join(json.dumps({"text": t}) for t in _texts(50)) + "\n")
    cfg = DataConfig(source="jsonl", path=str(path), tokenizer="bytes")
    cache = TokenCache.open_or_build(str(tmp_path / "c"), open_corpus(cfg), open_tokenizer("bytes"))
    assert cache.keys[:2] == ["d.jsonl:1", "d.jsonl:2"]
    assert cache.lengths[0] == len(_texts(50)[0]) + 1 and cache.tokens.dtype == np.uint16


def test_vocab_size_is_checked_against_the_tokenizer(tmp_path):
    folder = _text_folder(tmp_path / "corpus", n=10)
    tok = train_bpe(iter(_texts()), 300, str(tmp_path / "tok.json"))
    assert tok.vocab_size == 300
    work = tmp_path / "work"
    config = dysejax.load_config(TINY, FAST + ["data.source=text", f"data.path={folder}", f"data.tokenizer={tmp_path}/tok.json"])
    with pytest.raises(ConfigError, match=rf"^model.vocab_size \(264\) is smaller than the 300 tokens of data.tokenizer "
                                          rf"'{tmp_path}/tok.json': set model.vocab_size to at least 300$"):
        dysejax.Trainer(config, workdir=str(work), verbose=False)
    assert not work.exists()  # a bad input leaves no workdir behind


def test_training_on_a_text_folder_with_a_trained_bpe(tmp_path):
    """A user's folder of text, a BPE trained on it, two steps; a rerun reuses tokenizer and cache."""
    folder = _text_folder(tmp_path / "corpus", n=60)
    sets = FAST + ["data.source=text", f"data.path={folder}", "data.tokenizer=bpe", "model.vocab_size=320",
                   "data.buckets=[64]", "data.eval_batches=1", "train.eval_every=2"]
    trainer = dysejax.Trainer(dysejax.load_config(TINY, sets), workdir=str(tmp_path / "w"), verbose=False)
    assert trainer.data.tokenizer.vocab_size == 320
    rows = trainer.fit(steps=2)
    assert len(rows) == 2 and all(np.isfinite(r["loss"]) for r in rows) and "eval_loss" in rows[-1]
    assert rows[0]["loss"] == pytest.approx(np.log(320), rel=0.05)  # a fresh model is uniform over the vocabulary
    listing = sorted(os.listdir(tmp_path / "w" / "data"))
    assert len(listing) == 2 and listing[0].startswith("bpe-320-") and listing[1].startswith("tokens-")
