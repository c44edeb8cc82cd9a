"""Hugging Face Llama in and out, checked against `transformers`' own Llama (a small random-weight
model built here; no download): logits within 1e-4 at float32, import -> export bit-exact, and
training continued from the import with `plan: auto` at a longer context than the original."""
import json
import logging
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import jax  # noqa: E402

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


def _llama(folder, tie=False, scaling=True, act="silu", layers=2, dtype=None, shard=None, init=0.02):
    """A random-weight LlamaForCausalLM (grouped-query, llama3 rope scaling) saved to `folder`
    (in `dtype`, in shards of `shard` when given)."""
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=320, hidden_size=64, intermediate_size=96, num_hidden_layers=layers, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=ORIGINAL_CONTEXT, rms_norm_eps=1e-5, rope_theta=5000.0,
        tie_word_embeddings=tie, bos_token_id=1, eos_token_id=2, hidden_act=act, initializer_range=init,
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
    if dtype is not None:
        model = model.to(dtype)
    model.save_pretrained(folder, safe_serialization=True, **({"max_shard_size": shard} if shard else {}))
    return model


def _safetensors(folder):
    """Every tensor of a folder's *.safetensors files (one file or shards)."""
    from safetensors.torch import load_file
    out = {}
    for name in sorted(os.listdir(folder)):
        if name.endswith(".safetensors"):
            out.update(load_file(os.path.join(folder, name)))
    return out


def _assert_same_tensors(before, after):
    assert sorted(before) == sorted(after)
    for name in before:
        a, b = before[name], after[name]
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(-1), b.view(-1)), name


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


@pytest.mark.parametrize("tie, scaling, shard", [(False, True, None), (True, False, "40KB")])
def test_import_matches_transformers_and_export_round_trips(tmp_path, tie, scaling, shard, capsys, caplog):
    hf = _llama(tmp_path / "hf", tie, scaling, shard=shard)
    assert (shard is not None) == (tmp_path / "hf" / "model.safetensors.index.json").exists()
    work, out = tmp_path / "w", tmp_path / "out"
    caplog.clear()
    capsys.readouterr()
    assert hf_main(["import", str(tmp_path / "hf"), "--workdir", str(work)]) == 0
    tokens = np.random.default_rng(0).integers(0, 320, (2, 48)).astype(np.int32)
    with torch.no_grad():
        want = hf(torch.from_numpy(tokens.astype(np.int64))).logits.float().numpy()
    got = _ours(work, tokens)
    assert np.max(np.abs(got - want)) <= 1e-4, np.max(np.abs(got - want))
    # export: the same tensors, bit for bit, and transformers loads it to the same model
    assert hf_main(["export", "--workdir", str(work), str(out)]) == 0
    # two lines on stdout for the import, one for the export; nothing else, no library warnings
    captured = capsys.readouterr()
    assert len(captured.out.splitlines()) == 3 and not captured.err, captured
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    _assert_same_tensors(_safetensors(tmp_path / "hf"), _safetensors(out))
    back = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    assert back.config.rope_parameters == hf.config.rope_parameters
    assert back.config.num_key_value_heads == 2 and back.config.tie_word_embeddings == tie
    with torch.no_grad():
        again = back(torch.from_numpy(tokens.astype(np.int64))).logits.float().numpy()
    assert np.array_equal(again, want)


# transformers' hidden_act names -> the same function in dysejax; gelu is the exact (erf) form
ACTS = ["silu", "swish", "gelu", "gelu_pytorch_tanh", "gelu_new", "gelu_fast", "relu"]


def test_every_accepted_activation_matches_transformers(tmp_path):
    """Each hidden_act the importer accepts computes transformers' function: logits within 1e-4.
    The check can tell the two gelu forms apart: computing transformers' (exact) gelu with the
    tanh form misses by over 10x the bound."""
    from dysejax.hf.llama import ACTIVATIONS
    assert sorted(ACTIVATIONS) == sorted(ACTS)
    tokens = np.random.default_rng(1).integers(0, 320, (1, 64)).astype(np.int32)
    for act in ACTS:
        hf = _llama(tmp_path / act, scaling=False, act=act, layers=1, init=0.2)  # large enough that gelus differ
        with torch.no_grad():
            want = hf(torch.from_numpy(tokens.astype(np.int64))).logits.float().numpy()
        import_model(str(tmp_path / act), str(tmp_path / f"w_{act}"))
        err = np.max(np.abs(_ours(tmp_path / f"w_{act}", tokens) - want))
        assert err <= 1e-4, (act, err)
        if act == "gelu":
            _rewrite_activation(tmp_path / f"w_{act}", "gelu_exact", "gelu")
            wrong = np.max(np.abs(_ours(tmp_path / f"w_{act}", tokens) - want))
            assert wrong > 1e-3, wrong


def _rewrite_activation(workdir, old, new):
    path = workdir / "config.yaml"
    text = path.read_text()
    assert f"activation: {old}" in text
    path.write_text(text.replace(f"activation: {old}", f"activation: {new}"))


def test_bfloat16_model_imports_and_exports_bit_exact(tmp_path):
    """A bfloat16 folder (safetensors' numpy reader has no bfloat16) imports as bfloat16
    parameters equal to its tensors and exports byte-identical."""
    _llama(tmp_path / "hf", dtype=torch.bfloat16)
    assert json.loads((tmp_path / "hf" / "config.json").read_text()).get("dtype", "bfloat16") == "bfloat16"
    import_model(str(tmp_path / "hf"), str(tmp_path / "w"))
    params = read_numpy(os.path.join(tmp_path / "w", "hf_params"))
    embed = _safetensors(tmp_path / "hf")["model.embed_tokens.weight"]
    assert params["embed"].dtype.name == "bfloat16"
    np.testing.assert_array_equal(params["embed"].astype(np.float32), embed.float().numpy())
    export_model(str(tmp_path / "w"), str(tmp_path / "out"))
    _assert_same_tensors(_safetensors(tmp_path / "hf"), _safetensors(tmp_path / "out"))


def test_the_printed_command_continues_training_from_any_directory_at_a_longer_context(tmp_path, capsys):
    """The "continue training" line of `import`, run as printed from another directory, on a
    workdir whose path has a space and glob syntax (`[x]`, which orbax would read as a pattern):
    plan auto, a 128-token bucket past the original 64-token context (llama3 rope scaling as
    imported), the import's tokenizer; it starts from the imported weights (a tiny learning rate
    keeps them within 1e-6), checkpoints, and exports again to a folder with the same syntax."""
    import shlex
    import subprocess
    import sys

    _llama(tmp_path / "hf")
    work = tmp_path / "runs" / "w [x]"
    capsys.readouterr()
    assert hf_main(["import", str(tmp_path / "hf"), "--workdir", str(work)]) == 0
    line = capsys.readouterr().out.splitlines()[-1]
    assert line.startswith("continue training: python ")
    argv = shlex.split(line.split(": ", 1)[1])
    assert os.path.isabs(argv[1]) and argv[2:] == ["--config", str(work / "config.yaml"), "--workdir", str(work)]
    config = load_config(os.path.join(work, "config.yaml"))
    assert config.parallel.plan == "auto" and config.model.rope_scaling.type == "llama3"
    assert config.data.tokenizer == os.path.join(work, "tokenizer")
    sets = [s for s in FAST if not s.startswith(("model.", "data.tokenizer", "data.buckets"))]
    sets += ["data.buckets=[128]", "data.tokens_per_batch=1024", "parallel.hardware=a100-80gb",
             "optimizer.lr=1e-9", "train.checkpoint_every=3"]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    run = subprocess.run([sys.executable, *argv[1:], "--steps", "3", "--set", *sets], cwd=elsewhere, env=env,
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    rows = [json.loads(r) for r in (work / "metrics.jsonl").read_text().splitlines()]
    assert [r["bucket"] for r in rows] == [128] * 3 and all(np.isfinite(r["loss"]) for r in rows)
    trained = read_numpy(os.path.join(work, "checkpoints", "3", "state"))["params"]
    imported = read_numpy(os.path.join(work, "hf_params"))
    for name in imported:
        np.testing.assert_allclose(trained[name], imported[name], atol=1e-6, err_msg=name)
    out = tmp_path / "out [x]"
    assert export_model(str(work), str(out)) == "checkpoint step 3"
    model = transformers.AutoModelForCausalLM.from_pretrained(out)
    np.testing.assert_array_equal(model.model.embed_tokens.weight.detach().numpy(), trained["embed"])
    assert sorted(f for f in os.listdir(out) if f.startswith("tokenizer")) == ["tokenizer.json"]
