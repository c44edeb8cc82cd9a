"""Bad model folders and workdirs through `python -m dysejax.hf` (in-process): each is one `error:`
line naming the file, the tensor or field, and the fix; exit status 2; the model folder, the
workdir and the output folder exactly as they were (listing, sizes, mtimes, bytes).

The folders are written by tests/hf_folders.py with safetensors and json alone (no torch):
head_dim 6, so that no matrix is square and a transposed one shows in its shape."""
import json
import logging
import os

import numpy as np
import pytest

from dysejax.hf.__main__ import main as hf_main
from tests.hf_folders import CONFIG, llama_tensors, write_llama
from tests.snapshot import snapshot, truncate_files


def _with(**changes):
    """CONFIG with `changes` (a value of None removes the key)."""
    cfg = {**CONFIG, **changes}
    return {k: v for k, v in cfg.items() if v is not None}


def _tensors(cfg=None, drop=(), dtype=np.float32, **replace):
    """The tensors of `cfg` without `drop`, with `replace` (names with '__' for '.')."""
    t = llama_tensors(cfg or CONFIG, dtype)
    for name in drop:
        del t[name]
    t.update({k.replace("__", "."): v for k, v in replace.items()})
    return t


L0 = "model.layers.0."
F = np.float32


def _import_case(kind, tmp):
    """Prepare the model folder for an import case; returns (argv, expected start of the message)."""
    hf, w = tmp / "hf", tmp / "w"
    write_llama(hf)
    cfg_path, st = hf / "config.json", hf / "model.safetensors"
    cases = {
        # the folder and config.json
        "no_folder": (lambda: None, f"'{tmp}/nope' is not a folder: point at a Hugging Face model folder"),
        "no_config": (lambda: os.remove(cfg_path), f"'{hf}' has no config.json: point at a Hugging Face model folder"),
        "config_not_json": (lambda: cfg_path.write_text('{"hidden_size": 32,\n oops}'),
                            f"{cfg_path} is not valid JSON (Expecting property name enclosed in double quotes at "
                            "line 2 column 2): fix config.json or save the model again"),
        "config_not_object": (lambda: cfg_path.write_text("[1, 2]"),
                              f"{cfg_path} holds a JSON list, not an object: fix config.json"),
        "config_missing_field": (lambda: _config(hf, _with(num_attention_heads=None)),
                                 "config.json has no num_attention_heads: add it"),
        "config_field_type": (lambda: _config(hf, _with(hidden_size="32")),
                              "config.json hidden_size is '32': it must be a positive integer"),
        "qwen2": (lambda: _config(hf, _with(model_type="qwen2", attention_bias=None, mlp_bias=None,
                                                 sliding_window=None, use_sliding_window=False)),
                  "config.json model_type='qwen2': dysejax imports Llama-architecture models (model_type llama or "
                  "mistral) without biases or sliding windows"),
        "attention_bias": (lambda: _config(hf, _with(attention_bias=True, mlp_bias=False)),
                           "config.json attention_bias=True: dysejax imports Llama-architecture models"),
        "sliding_window": (lambda: _config(hf, _with(model_type="mistral", sliding_window=4096)),
                           "config.json sliding_window=4096: dysejax imports"),
        "activation": (lambda: _config(hf, _with(hidden_act="gelu_10")),
                       "config.json hidden_act 'gelu_10' is not supported: dysejax imports silu, swish, gelu, "
                       "gelu_pytorch_tanh, gelu_new, gelu_fast, relu"),
        "rope_llama3_incomplete": (
            lambda: _config(hf, _with(rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                        "high_freq_factor": 4.0})),
            "config.json rope_scaling (llama3) has no original_max_position_embeddings: add the value the model was "
            "trained with (transformers falls back to max_position_embeddings=64: add that if it is the "
            "pre-training context)"),
        "rope_yarn": (lambda: _config(hf, _with(rope_scaling={"rope_type": "yarn", "factor": 4.0})),
                      "config.json rope_scaling type 'yarn' is not supported (dysejax knows linear and llama3)"),
        "heads_vs_kv_heads": (lambda: _config(hf, _with(num_key_value_heads=3)),
                              "config.json num_attention_heads (4) is not a multiple of num_key_value_heads (3)"),
        "dtype_unknown": (lambda: _config(hf, _with(torch_dtype="int8")),
                          "config.json torch_dtype 'int8' is not supported: float32, bfloat16 or float16"),
        # the safetensors files
        "no_safetensors": (lambda: os.remove(st), f"'{hf}' has no *.safetensors files"),
        "truncated": (lambda: st.write_bytes(st.read_bytes()[:-100]),
                      f"{st} is not a readable safetensors file (Error while deserializing header: "),
        "garbage": (lambda: st.write_bytes(b"not a safetensors file at all"),
                    f"{st} is not a readable safetensors file ("),
        "index_missing_shard": (lambda: (hf / "model.safetensors.index.json").write_text(json.dumps(
            {"weight_map": {"model.norm.weight": "model-00002-of-00002.safetensors"}})),
            f"{hf}/model.safetensors.index.json names model-00002-of-00002.safetensors, which '{hf}' does not hold"),
        "duplicate_tensor": (lambda: _two_shards(hf),
                             f"{hf}/b.safetensors and {hf}/a.safetensors both hold model.norm.weight"),
        # every tensor's name, shape and dtype against config.json
        "missing_tensor": (lambda: write_llama(hf, tensors=_tensors(drop=["model.layers.1.mlp.up_proj.weight"])),
                           f"'{hf}' has no tensor model.layers.1.mlp.up_proj.weight (config.json num_hidden_layers "
                           "is 2)"),
        "missing_lm_head": (lambda: write_llama(hf, tensors=_tensors(drop=["lm_head.weight"])),
                            f"'{hf}' has no tensor lm_head.weight and config.json tie_word_embeddings is false: set "
                            "tie_word_embeddings to true"),
        "q_proj_shape": (lambda: write_llama(hf, tensors=_tensors(**{L0 + "self_attn__q_proj__weight": np.zeros((20, 32), F)})),
                         f"{st}: model.layers.0.self_attn.q_proj.weight is [20, 32], config.json gives "
                         "[num_attention_heads*head_dim, hidden_size] = [24, 32]: the weights and config.json are "
                         "of different models"),
        "k_proj_shape": (lambda: write_llama(hf, tensors=_tensors(**{L0 + "self_attn__k_proj__weight": np.zeros((24, 32), F)})),
                         f"{st}: model.layers.0.self_attn.k_proj.weight is [24, 32], config.json gives "
                         "[num_key_value_heads*head_dim, hidden_size] = [12, 32]"),
        "layer_norm_shape": (lambda: write_llama(hf, tensors=_tensors(**{L0 + "input_layernorm__weight": np.ones(31, F)})),
                             f"{st}: model.layers.0.input_layernorm.weight is [31], config.json gives [hidden_size] "
                             "= [32]"),
        "final_norm_shape": (lambda: write_llama(hf, tensors=_tensors(model__norm__weight=np.ones((1, 32), F))),
                             f"{st}: model.norm.weight is [1, 32], config.json gives [hidden_size] = [32]"),
        "embed_shape": (lambda: write_llama(hf, tensors=_tensors(model__embed_tokens__weight=np.zeros((300, 30), F))),
                        f"{st}: model.embed_tokens.weight is [300, 30], config.json gives [vocab_size, hidden_size] = "
                        "[300, 32]"),
        "vocab_vs_embed": (lambda: _config(hf, _with(vocab_size=320)),
                           f"{st}: model.embed_tokens.weight has 300 rows but config.json vocab_size is 320: set "
                           "vocab_size to 300"),
        "lm_head_rows": (lambda: write_llama(hf, tensors=_tensors(lm_head__weight=np.zeros((90, 32), F))),
                         f"{st}: lm_head.weight has 90 rows but config.json vocab_size is 300: set vocab_size to 90"),
        "gate_proj_transposed": (
            lambda: write_llama(hf, tensors=_tensors(**{L0 + "mlp__gate_proj__weight": np.zeros((32, 48), F)})),
            f"{st}: model.layers.0.mlp.gate_proj.weight is [32, 48], the transpose of [intermediate_size, "
            "hidden_size] = [48, 32] that config.json gives: save it in torch.nn.Linear's [out_features, "
            "in_features] layout"),
        "extra_layer": (lambda: write_llama(hf, tensors=_tensors(_with(num_hidden_layers=3))),
                        f"{st}: model.layers.2."),
        "bias_tensor": (lambda: write_llama(hf, tensors=_tensors(**{L0 + "self_attn__q_proj__bias": np.zeros(24, F)})),
                        f"{st}: model.layers.0.self_attn.q_proj.bias is a bias, which dysejax's Llama has none of"),
        "unknown_tensor": (lambda: write_llama(hf, tensors=_tensors(**{"model.vision_tower.weight": np.zeros(3, F)})),
                           f"{st}: model.vision_tower.weight is not a weight of a Llama model"),
        "tied_head_differs": (lambda: _config(hf, _with(tie_word_embeddings=True)),
                              f"{st}: lm_head.weight differs from model.embed_tokens.weight but config.json "
                              "tie_word_embeddings is true: set tie_word_embeddings to false"),
        "dtype_f64": (lambda: write_llama(hf, tensors=_tensors(model__norm__weight=np.ones(32, np.float64))),
                      f"{st}: model.norm.weight is F64; dysejax reads F32, BF16 and F16 weights"),
        "f32_under_bf16": (lambda: _config(hf, _with(torch_dtype="bfloat16")),
                           f"{st}: model.embed_tokens.weight is F32 but config.json torch_dtype is bfloat16 (the "
                           "import would round it): set torch_dtype to float32"),
        # the workdir
        "workdir_not_empty": (lambda: (w.mkdir(), (w / "keep.txt").write_text("mine")),
                              f"--workdir '{w}' is not empty: name a new or empty folder (nothing was overwritten)"),
        "workdir_is_file": (lambda: w.write_text("a file"), f"--workdir '{w}' is a file: name a new or empty folder"),
        "bad_buckets": (lambda: None, "data.buckets"),
        "small_vocab_no_tokenizer": (lambda: write_llama(hf, _with(vocab_size=200), llama_tensors(_with(vocab_size=200))),
                                     f"'{hf}' has no tokenizer (tokenizer.json or tokenizer.model) and config.json "
                                     "vocab_size 200 is below the 259 ids of byte tokens: put the model's tokenizer "
                                     "files in the folder"),
    }
    prepare, message = cases[kind]
    prepare()
    source = tmp / "nope" if kind == "no_folder" else hf
    argv = ["import", str(source), "--workdir", str(w)] + (["--buckets", "0"] if kind == "bad_buckets" else [])
    return argv, message


def _config(hf, cfg):
    """Replace the folder's config.json by `cfg` (the tensors stay those of CONFIG)."""
    (hf / "config.json").write_text(json.dumps(cfg))


def _two_shards(hf):
    from safetensors.numpy import save_file
    t = llama_tensors(CONFIG)
    os.remove(hf / "model.safetensors")
    save_file(t, str(hf / "a.safetensors"))
    save_file({"model.norm.weight": t["model.norm.weight"]}, str(hf / "b.safetensors"))


IMPORT_KINDS = ["no_folder", "no_config", "config_not_json", "config_not_object", "config_missing_field",
                "config_field_type", "qwen2", "attention_bias", "sliding_window", "activation",
                "rope_llama3_incomplete", "rope_yarn", "heads_vs_kv_heads", "dtype_unknown", "no_safetensors",
                "truncated", "garbage", "index_missing_shard", "duplicate_tensor", "missing_tensor", "missing_lm_head",
                "q_proj_shape", "k_proj_shape", "layer_norm_shape", "final_norm_shape", "embed_shape",
                "vocab_vs_embed", "lm_head_rows", "gate_proj_transposed", "extra_layer", "bias_tensor",
                "unknown_tensor", "tied_head_differs", "dtype_f64", "f32_under_bf16", "workdir_not_empty",
                "workdir_is_file", "bad_buckets", "small_vocab_no_tokenizer"]


def _run(argv, capsys, caplog=None):
    """(exit status, stderr, stdout) of the CLI; with `caplog`, also asserts no library logged a
    warning (it would print a second line)."""
    capsys.readouterr()
    if caplog is not None:
        caplog.clear()
    try:
        status = hf_main(argv)
    except SystemExit as e:  # argparse's usage errors
        status = e.code
    captured = capsys.readouterr()
    if caplog is not None:
        logged = [f"{r.name}: {r.getMessage()}" for r in caplog.records if r.levelno >= logging.WARNING]
        assert not logged, logged
    return status, captured.err, captured.out


def _assert_refused(argv, message, watched, capsys, caplog) -> str:
    """Run `argv`: exit 2, one `error: message...` line, every `watched` folder unchanged; its stdout."""
    before = [snapshot(p) for p in watched]
    status, err, out = _run(argv, capsys, caplog)
    lines = err.strip().splitlines()
    assert status == 2, err
    assert len(lines) == 1 and lines[0].startswith(f"error: {message}"), err
    assert [snapshot(p) for p in watched] == before, f"{argv}: a folder changed"
    return out


@pytest.mark.parametrize("kind", IMPORT_KINDS)
def test_bad_import_is_one_error_line_exit_2_and_writes_nothing(kind, tmp_path, capsys, caplog):
    argv, message = _import_case(kind, tmp_path)
    out = _assert_refused(argv, message, [tmp_path / "hf", tmp_path / "w"], capsys, caplog)
    assert out == ""


def test_each_non_square_matrix_stored_transposed_is_named(tmp_path, capsys):
    """With head_dim 6 and grouped K/V, every matrix is non-square: each one transposed in turn
    is refused by name, as a transpose."""
    write_llama(tmp_path / "hf")
    for name, value in llama_tensors(CONFIG).items():
        if value.ndim != 2 or name in ("model.embed_tokens.weight", "lm_head.weight"):
            continue
        write_llama(tmp_path / "hf", tensors={**llama_tensors(CONFIG), name: np.ascontiguousarray(value.T)})
        status, err, _ = _run(["import", str(tmp_path / "hf"), "--workdir", str(tmp_path / "w")], capsys)
        assert status == 2 and f": {name} is [{value.shape[1]}, {value.shape[0]}], the transpose of" in err, err
        assert not (tmp_path / "w").exists()


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    """A workdir imported from a good folder (no training: export reads the imported parameters)."""
    tmp = tmp_path_factory.mktemp("imported")
    write_llama(tmp / "hf")
    assert hf_main(["import", str(tmp / "hf"), "--workdir", str(tmp / "w")]) == 0
    return tmp / "w"


def _export_case(kind, tmp, imported):
    import shutil

    w, out = tmp / "w", tmp / "out"
    shutil.copytree(imported, w)
    extra = []
    cases = {
        "nothing_there": (lambda: shutil.rmtree(w), f"'{w}' holds neither a training checkpoint nor an import"),
        "no_such_step": (lambda: extra.extend(["--step", "7"]), f"'{w}' has no checkpoint of step 7"),
        "out_not_empty": (lambda: (out.mkdir(), (out / "keep.txt").write_text("mine")),
                          f"the output folder '{out}' is not empty: name a new or empty folder"),
        "out_is_file": (lambda: out.write_text("a file"), f"the output folder '{out}' is a file"),
        "params_corrupt": (lambda: truncate_files(w / "hf_params"), f"{w}/hf_params is not a readable orbax checkpoint"),
        "config_other_model": (lambda: _edit_yaml(w / "config.yaml", "d_model: 32", "d_model: 40"),
                               f"{w} (the imported parameters): parameter embed is (300, 32), the model of its config "
                               "needs (300, 40): export with the config that trained (or imported) these parameters"),
        "plain_mlp": (lambda: _edit_yaml(w / "config.yaml", "mlp: gated", "mlp: plain"),
                      "model.mlp is 'plain': a Llama config.json describes gated MLPs only"),
        "import_record_corrupt": (lambda: (w / "hf_import.json").write_text("{"),
                                  f"{w}/hf_import.json is not valid JSON"),
        "checkpoint_meta_corrupt": (lambda: _fake_step(w, "{oops"), f"{w}/checkpoints/3/meta/metadata is not valid "
                                                                     "JSON (Expecting property name"),
        "checkpoint_meta_no_model": (lambda: _fake_step(w, "{}"), f"{w}/checkpoints/3 has no model in its metadata: "
                                                                  "export another --step"),
    }
    prepare, message = cases[kind]
    prepare()
    return ["export", "--workdir", str(w), str(out), *extra], message


def _edit_yaml(path, old, new):
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))


def _fake_step(w, metadata):
    (w / "checkpoints" / "3" / "meta").mkdir(parents=True)
    (w / "checkpoints" / "3" / "meta" / "metadata").write_text(metadata)


EXPORT_KINDS = ["nothing_there", "no_such_step", "out_not_empty", "out_is_file", "params_corrupt",
                "config_other_model", "plain_mlp", "import_record_corrupt", "checkpoint_meta_corrupt",
                "checkpoint_meta_no_model"]


@pytest.mark.parametrize("kind", EXPORT_KINDS)
def test_bad_export_is_one_error_line_exit_2_and_writes_nothing(kind, tmp_path, imported, capsys, caplog):
    argv, message = _export_case(kind, tmp_path, imported)
    _assert_refused(argv, message, [tmp_path / "w", tmp_path / "out"], capsys, caplog)
