"""Hugging Face Llama in and out, checked against `transformers`' own Llama (a small random-weight
model built here; no download): logits within 1e-4 at float32, import -> export bit-exact, and
training continued from the import with `plan: auto` at a longer context than the original."""
import json
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import jax  # noqa: E402
import flax.linen as nn  # noqa: E402

import dysejax  # noqa: E402
from dysejax.checkpoint import read_numpy  # noqa: E402
from dysejax.config import load_config  # noqa: E402
from dysejax.data.tokenizers import train_bpe  # noqa: E402
from dysejax.hf import export_model, import_model  # noqa: E402
from dysejax.hf.__main__ import main as hf_main  # noqa: E402
from dysejax.model.transformer import Transformer  # noqa: E402
from sharding.mesh import build_mesh  # noqa: E402
from sharding.plan import parse_plan  # noqa: E402
from sharding.strategies import STRATEGIES  # noqa: E402
from tests.conftest import FAST  # noqa: E402

ORIGINAL_CONTEXT = 64


def _llama(folder, tie=False, scaling=True):
    """A random-weight LlamaForCausalLM (grouped-query, llama3 rope scaling) saved to `folder`."""
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=320, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=ORIGINAL_CONTEXT, rms_norm_eps=1e-5, rope_theta=5000.0,
        tie_word_embeddings=tie, bos_token_id=1, eos_token_id=2,
        rope_scaling={"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 16} if scaling else None)
    model = transformers.LlamaForCausalLM(cfg).eval()
    words = "def class return import for while with yield lambda self None True False".split()
    rng = np.random.default_rng(0)
    train_bpe((" ".join(rng.choice(words, 20)) for _ in range(200)), 320, str(folder / "tokenizer.json"))
    with torch.no_grad():  # norms away from 1 so that they are checked too
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    model.save_pretrained(folder, safe_serialization=True)
    return model


def _ours(workdir, tokens):
    """float32 logits of the imported model (single device, plan dp)."""
    config = load_config(os.path.join(workdir, "config.yaml"))
    params = read_numpy(os.path.join(workdir, "hf_params"))
    B, S = tokens.shape
    mesh = build_mesh({"data": 1}, jax.devices()[:1])
    plan = parse_plan("dp", config.model.n_layers, list(STRATEGIES))
    fn = jax.jit(lambda p, t: Transformer(config.model).apply(
        {"params": p}, t, np.ones((B, S), np.int32), np.broadcast_to(np.arange(S, dtype=np.int32), (B, S)),
        plan=plan, mesh=mesh, method=Transformer.logits))
    return np.asarray(fn(params, tokens))


@pytest.mark.parametrize("tie, scaling", [(False, True), (True, False)])
def test_import_matches_transformers_and_export_round_trips(tmp_path, tie, scaling):
    hf = _llama(tmp_path / "hf", tie, scaling)
    work, out = tmp_path / "w", tmp_path / "out"
    assert hf_main(["import", str(tmp_path / "hf"), "--workdir", str(work)]) == 0
    tokens = np.random.default_rng(0).integers(0, 320, (2, 48)).astype(np.int32)
    with torch.no_grad():
        want = hf(torch.from_numpy(tokens.astype(np.int64))).logits.float().numpy()
    got = _ours(work, tokens)
    assert np.max(np.abs(got - want)) <= 1e-4, np.max(np.abs(got - want))
    # export: the same tensors, bit for bit, and transformers loads it to the same model
    assert hf_main(["export", "--workdir", str(work), str(out)]) == 0
    from safetensors.numpy import load_file
    before, after = load_file(tmp_path / "hf" / "model.safetensors"), load_file(out / "model.safetensors")
    assert sorted(before) == sorted(after)
    for name in before:
        assert before[name].dtype == after[name].dtype and before[name].tobytes() == after[name].tobytes(), name
    back = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    assert back.config.rope_parameters == hf.config.rope_parameters
    assert back.config.num_key_value_heads == 2 and back.config.tie_word_embeddings == tie
    with torch.no_grad():
        again = back(torch.from_numpy(tokens.astype(np.int64))).logits.float().numpy()
    assert np.array_equal(again, want)


def test_bad_import_and_export_are_one_line_errors(tmp_path, capsys):
    (tmp_path / "nothing").mkdir()
    assert hf_main(["import", str(tmp_path / "nothing"), "--workdir", str(tmp_path / "w")]) == 2
    assert capsys.readouterr().err == f"error: '{tmp_path}/nothing' has no config.json: point at a Hugging Face model folder\n"
    _llama(tmp_path / "hf")
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "keep.txt").write_text("mine")
    assert hf_main(["import", str(tmp_path / "hf"), "--workdir", str(tmp_path / "busy")]) == 2
    assert "is not empty: name a new or empty folder (nothing was overwritten)" in capsys.readouterr().err
    assert os.listdir(tmp_path / "busy") == ["keep.txt"] and not (tmp_path / "w").exists()
    cfg = json.loads((tmp_path / "hf" / "config.json").read_text())
    (tmp_path / "bias").mkdir()
    (tmp_path / "bias" / "config.json").write_text(json.dumps({**cfg, "attention_bias": True}))
    assert hf_main(["import", str(tmp_path / "bias"), "--workdir", str(tmp_path / "w")]) == 2
    assert "dysejax imports Llama-architecture models without biases or sliding windows" in capsys.readouterr().err


def test_training_continues_from_the_import_at_a_longer_context(tmp_path):
    """train.py's Trainer on the import's config: plan auto, a 128-token bucket past the original
    64-token context (llama3 rope scaling as imported), the import's tokenizer; it starts from the
    imported weights (a tiny learning rate keeps them within 1e-6) and exports again."""
    _llama(tmp_path / "hf")
    work = tmp_path / "w"
    import_model(str(tmp_path / "hf"), str(work))
    sets = [s for s in FAST if not s.startswith(("model.", "data.tokenizer", "data.buckets"))]
    sets += ["data.buckets=[128]", "data.tokens_per_batch=1024", "parallel.hardware=a100-80gb",
             "optimizer.lr=1e-9", "train.checkpoint_every=3"]
    config = load_config(os.path.join(work, "config.yaml"), sets)
    assert config.parallel.plan == "auto" and config.model.rope_scaling.type == "llama3"
    assert config.data.tokenizer == os.path.join(work, "tokenizer")
    trainer = dysejax.Trainer(config, workdir=str(work), verbose=False)
    rows = trainer.fit(steps=3)
    assert [r["bucket"] for r in rows] == [128] * 3 and all(np.isfinite(r["loss"]) for r in rows)
    trained = jax.tree.map(np.asarray, nn.unbox(trainer.state["params"]))
    imported = read_numpy(os.path.join(work, "hf_params"))
    for name in imported:
        np.testing.assert_allclose(trained[name], imported[name], atol=1e-6, err_msg=name)
    out = tmp_path / "out"
    assert export_model(str(work), str(out)) == "checkpoint step 3"
    model = transformers.AutoModelForCausalLM.from_pretrained(out)
    np.testing.assert_array_equal(model.model.embed_tokens.weight.detach().numpy(), trained["embed"])
    assert sorted(f for f in os.listdir(out) if f.startswith("tokenizer")) == ["tokenizer.json"]
