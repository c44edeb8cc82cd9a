"""Held-out loss and perplexity per bucket, on a fixed eval split, logged with the training rows."""
import math

import numpy as np
import pytest

import dysejax
from dysejax.metrics import read_metrics


def test_eval_loss_and_perplexity_per_bucket(tiny_config, tmp_path):
    trainer = dysejax.Trainer(tiny_config("train.eval_every=2", "data.eval_batches=1"), workdir=str(tmp_path),
                              verbose=False)
    plans = trainer.data.eval_plans()
    assert sorted(p.bucket for p in plans) == [64, 128]  # one fixed batch per bucket
    assert not {s[0] for p in plans for row in p.rows for s in row} & set(trainer.data.train_docs.tolist())
    rows = trainer.fit(steps=2)
    row = rows[-1]
    for b in (64, 128):
        assert row[f"eval_ppl_{b}"] == pytest.approx(math.exp(row[f"eval_loss_{b}"]))
        assert row[f"eval_tokens_{b}"] == sum(p.loss_tokens for p in plans if p.bucket == b)
    weighted = sum(row[f"eval_loss_{b}"] * row[f"eval_tokens_{b}"] for b in (64, 128)) / row["eval_tokens"]
    assert row["eval_loss"] == pytest.approx(weighted) and row["eval_ppl"] == pytest.approx(math.exp(weighted))
    assert np.log(264) * 0.5 < row["eval_loss"] < np.log(264) * 1.1  # near uniform after two steps
    assert trainer.evaluate(trainer.state["params"]) == {k: v for k, v in row.items() if k.startswith("eval_")}
    assert read_metrics(str(tmp_path), "eval")[-1]["eval_loss_128"] == row["eval_loss_128"]
