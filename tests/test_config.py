"""Config schema: defaults, overrides, and errors that name the field."""
import os
import subprocess
import sys

import pytest

import dysejax
from dysejax.config import GeometricBuckets, load_config, parse_override
from dysejax.errors import ConfigError
from tests.conftest import ROOT, TINY


def test_tiny_config_loads_with_defaults():
    c = load_config(TINY)
    assert c.model.n_layers == 2 and c.model.d_model == 128 and c.model.n_heads == 8
    assert c.data.source == "stdlib" and c.data.bucket_lengths() == [64, 128, 256]
    assert c.parallel.plan == "dp" and c.parallel.mesh == {"data": -1}
    assert c.parallel.memory_budget_gb is None


def test_overrides_are_yaml_typed_and_nested():
    c = load_config(TINY, ["train.steps=7", "optimizer.lr=1e-3", "parallel.mesh={data: 4, model: 2}",
                           "data.buckets={min: 32, max: 256, factor: 2}"])
    assert c.train.steps == 7 and c.optimizer.lr == 1e-3
    assert c.parallel.mesh == {"data": 4, "model": 2}
    assert isinstance(c.data.buckets, GeometricBuckets) and c.data.bucket_lengths() == [32, 64, 128, 256]


def test_geometric_buckets_round_and_dedupe():
    c = load_config(None, ["data.buckets={min: 100, max: 400, factor: 1.5}"])
    assert c.data.bucket_lengths() == [100, 150, 225, 338]


@pytest.mark.parametrize("override, message", [
    ("model.n_layer=3", "unknown key 'model.n_layer'; did you mean 'n_layers'"),
    ("trian.steps=3", "unknown key 'trian'; did you mean 'train'?"),
    ("model.n_layers=two", "model.n_layers: expected an integer, got 'two'"),
    ("model.n_layers=2.5", "model.n_layers: expected an integer, got 2.5"),
    ("train.tensorboard=3", "train.tensorboard: expected true or false, got 3"),
    ("data.source=web",
     "data.source: expected one of 'stdlib' | 'text' | 'jsonl' | 'parquet' | 'arrow' | 'synthetic', got 'web'"),
    ("data.buckets=[]", "data.buckets is empty: give at least one bucket length, e.g. [128, 256]"),
    ("data.buckets=[64, -1]", "data.buckets[1] must be positive, got -1"),
    ("model.n_heads=7", "model.d_model (128) must be divisible by model.n_heads (7), or set model.head_dim"),
    ("model.vocab_size=200", "model.vocab_size must be at least 259"),  # with data.tokenizer=bytes (below)
    ("parallel.mesh={data: -1, model: -1}", "parallel.mesh: at most one axis may be -1"),
    ("parallel.mesh={}", "parallel.mesh is empty"),
    ("optimizer.lr=0", "optimizer.lr must be positive, got 0.0"),
    ("data.source=text", "data.path is required for data.source='text'"),
    ("optimizer.name=lamb", "optimizer.name: expected one of"),
])
def test_bad_values_name_the_field(override, message):
    with pytest.raises(ConfigError) as e:
        load_config(TINY, ["data.tokenizer=bytes", override])
    assert message in str(e.value)


@pytest.mark.parametrize("text", ["train.steps", "=3", "a..b=1"])
def test_bad_override_syntax(text):
    with pytest.raises(ConfigError, match="bad --set"):
        parse_override(text)


def test_a_value_that_is_not_yaml_is_taken_as_written():
    assert load_config(TINY, ["data.glob=*.txt"]).data.glob == "*.txt"  # YAML reads `*` as an alias
    assert load_config(TINY, ["data.glob=[ab]*.py"]).data.glob == "[ab]*.py"
    with pytest.raises(ConfigError, match=r"^train.steps: expected an integer, got '\[1,'$"):
        load_config(TINY, ["train.steps=[1,"])


@pytest.mark.parametrize("override,hint", [
    ("optimizer.learning_rate=1e-3", "did you mean 'lr'?"),
    ("train.lr=1e-3", "did you mean 'optimizer.lr'?"),
    ("learning_rate=1e-3", "did you mean 'optimizer.lr'?"),
    ("train.max_steps=5", "did you mean 'steps'?"),
    ("model.num_layers=4", "did you mean 'n_layers'?"),
    ("optimizer.lrr=1", "did you mean 'lr'?"),
])
def test_aliases_get_a_did_you_mean(override, hint):
    with pytest.raises(ConfigError) as e:
        load_config(TINY, [override])
    assert hint in str(e.value)


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(str(tmp_path / "nope.yaml"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: [1, 2\n")
    with pytest.raises(ConfigError, match="is not valid YAML"):
        load_config(str(bad))
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("42\n")
    with pytest.raises(ConfigError, match="must hold a mapping"):
        load_config(str(scalar))


def _cli(*args, env_extra=None):
    env = dict(os.environ, **(env_extra or {}))
    return subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("args, message", [
    (["--config", TINY, "--set", "model.n_layer=3"], "error: unknown key 'model.n_layer'"),
    (["--config", TINY, "--set", "train.steps"], "error: bad --set 'train.steps'"),
    (["--config", TINY, "--bogus"], "error: unrecognized arguments: --bogus"),
    (["--config", TINY, "--steps", "x"], "error: argument --steps: invalid int value: 'x'"),
    (["--config", TINY, "--steps", "0"], "error: --steps must be positive, got 0"),
    (["--config", "missing.yaml"], "error: config file 'missing.yaml' not found"),
    (["--config", TINY, "--set", "parallel.mesh={data: 3}"], "error: parallel.mesh {'data': 3} multiplies to 3 but there are 8 devices"),
])
def test_cli_errors_are_one_line_exit_2(args, message, tmp_path):
    """Through `python train.py` in a process of its own (errors found after the data is read, and
    every other bad input, are in tests/test_bad_inputs.py, in-process)."""
    out = _cli(*args, "--workdir", str(tmp_path / "w"))
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(message), out.stderr
    assert not (tmp_path / "w").exists()  # nothing written


def test_config_api_is_exported():
    assert dysejax.load_config is load_config
    assert issubclass(dysejax.ConfigError, dysejax.UserError)
