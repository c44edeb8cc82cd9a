"""Data that streams: Parquet / Arrow / JSONL through the token cache, batches prepared on a
background thread, and a resumed run equal to an uninterrupted one."""
import json
import threading
import time

import numpy as np
import pytest

import dysejax
from dysejax.config import DataConfig
from dysejax.data import DataPipeline
from dysejax.prefetch import Prefetcher

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

WORDS = "def class return import for while with yield lambda self None True False".split()


def _texts(n, seed=0):
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=int(rng.integers(5, 60)))) for _ in range(n)]


def _write(folder, kind, texts, files=2):
    """`texts` split over `files` files of one format, with a second column that is not text."""
    folder.mkdir(parents=True, exist_ok=True)
    for f, part in enumerate(np.array_split(np.arange(len(texts)), files)):
        rows = [texts[i] for i in part]
        table = pa.table({"id": pa.array(part.astype(np.int64)), "content": pa.array(rows)})
        if kind == "parquet":
            pq.write_table(table, folder / f"part{f}.parquet", row_group_size=16)
        elif kind == "arrow":
            with pa.ipc.new_stream(str(folder / f"part{f}.arrow"), table.schema) as w:
                w.write_table(table)
        else:
            (folder / f"part{f}.jsonl").write_text("".join(json.dumps({"content": t}) + "\n" for t in rows))
    return folder


@pytest.mark.parametrize("kind", ["parquet", "arrow", "jsonl"])
def test_formats_give_the_same_tokens(tmp_path, kind):
    texts = _texts(90)
    folder = _write(tmp_path / kind, kind, texts)
    pipe = DataPipeline(DataConfig(source=kind, path=str(folder), text_field="content", buckets=[64, 128],
                                   tokens_per_batch=512, eval_fraction=0.0), cache_dir=str(tmp_path / "c"))
    src = pipe.source
    assert len(src.keys) == 90 and src.keys[0] == "part0." + kind + (":1" if kind == "jsonl" else ":0")
    for i in (0, 45, 89):
        assert pipe.tokenizer.decode(src.read(i, 0, int(src.lengths[i]))) == texts[i]


def test_missing_column_is_one_line(tmp_path):
    folder = _write(tmp_path / "p", "parquet", _texts(10), files=1)
    with pytest.raises(dysejax.DataError, match=r"part0.parquet: no column 'text' \(columns: id, content\): "
                                                r"set data.text_field to the column holding the text$"):
        DataPipeline(DataConfig(source="parquet", path=str(folder)), cache_dir=str(tmp_path / "c"))


def test_prefetcher_runs_ahead_and_reraises():
    made = []

    def produce():
        made.append(len(made))
        if len(made) == 5:
            raise ValueError("boom")
        return made[-1]

    with Prefetcher(produce, depth=2) as p:
        assert [p.next() for _ in range(4)] == [0, 1, 2, 3]
        with pytest.raises(ValueError, match="boom"):
            p.next()
    slow = threading.Event()

    def blocked():
        slow.wait(5)
        return 1

    t0 = time.perf_counter()
    with Prefetcher(blocked, depth=1) as p:  # the work happens off the caller's thread
        assert time.perf_counter() - t0 < 0.5
        slow.set()
        assert p.next() == 1


def test_resumed_streaming_run_equals_an_uninterrupted_one(tiny_config, tmp_path, capsys):
    """Parquet + a trained BPE: 4 steps in one go == 2 steps, a new Trainer, 2 more; the second
    Trainer on the same workdir neither retrains the tokenizer nor retokenises."""
    folder = _write(tmp_path / "corpus", "parquet", _texts(400), files=3)
    config = tiny_config("data.source=parquet", f"data.path={folder}", "data.text_field=content",
                         "data.tokenizer=bpe", "model.vocab_size=300", "data.buckets=[64]", "data.eval_batches=0",
                         "train.checkpoint_every=2")
    full = dysejax.Trainer(config, workdir=str(tmp_path / "full"), verbose=False).fit(steps=4)
    first = dysejax.Trainer(config, workdir=str(tmp_path / "part")).fit(steps=2)
    made = capsys.readouterr().out
    assert "tokenizer: byte-level BPE of 300 tokens" in made and "token cache: parquet (3 files" in made
    rest = dysejax.Trainer(config, workdir=str(tmp_path / "part")).fit(steps=4)
    again = capsys.readouterr().out
    assert "tokenizer:" not in again and "token cache:" not in again
    assert [r["step"] for r in rest] == [3, 4]
    assert [r["loss"] for r in first + rest] == [r["loss"] for r in full]
    assert all(r["data_wait_s"] >= 0 for r in full)
