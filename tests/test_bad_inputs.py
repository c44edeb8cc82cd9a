"""Bad inputs through the CLI (`train.main` in-process): each gives one `error:` line naming the
problem, exit status 2, and leaves the workdir exactly as it was (listing, sizes, mtimes, bytes)."""
import shutil

import pytest

import dysejax
import train
from tests.conftest import FAST, TINY
from tests.snapshot import snapshot, truncate_files


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A workdir holding a complete checkpoint of the FAST tiny model at step 2."""
    work = tmp_path_factory.mktemp("trained")
    config = dysejax.load_config(TINY, FAST + ["train.checkpoint_every=2"])
    dysejax.Trainer(config, workdir=str(work), verbose=False).fit(steps=2)
    return work


def _corrupt(work):
    truncate_files(work / "checkpoints" / "2" / "state")


def _case(kind, tmp, trained):
    """(extra argv, expected start of the error line) for one bad input; prepares files under tmp."""
    if kind in ("ckpt_corrupt", "ckpt_shape", "ckpt_dtype"):
        shutil.copytree(trained, tmp / "w")
    sets = {
        # config
        "unknown_key": (["model.n_layer=3"], "unknown key 'model.n_layer'; did you mean 'n_layers'"),
        "wrong_type": (["train.eval_every=abc"], "train.eval_every: expected an integer, got 'abc'"),
        "impossible_mesh": (["parallel.mesh={data: 3}"], "parallel.mesh {'data': 3} multiplies to 3 but there are 8"),
        "heads_vs_tp": (["model.n_heads=6", "model.head_dim=8", "parallel.plan=tp"],
                        "bucket 64 (batch 16): strategy 'tp' needs n_heads (6) divisible by the model-parallel size (8)"),
        "bucket_vs_sp": (["data.buckets=[64,100]", "parallel.plan=tp_sp"],
                         "bucket 100 (batch 8): strategy 'tp_sp' needs sequence length (100) divisible by the "
                         "model-parallel size (8)"),
        "no_plan_fits": (["parallel.memory_budget_gb=0.0001", "data.buckets=[64]"],
                         "bucket 64 (batch 16, train): no plan fits the memory budget"),
        "plan_not_a_bucket": (["parallel.plan={32: dp}"], "parallel.plan: 32 is not a bucket length"),
        "unknown_strategy": (["parallel.plan=zero9"], "parallel.plan: unknown strategy 'zero9'"),
        "plan_short": (["parallel.plan=[[dp, 1]]"], "parallel.plan: runs cover 1 layers but the model has 2"),
        "empty_buckets": (["data.buckets=[]"], "data.buckets is empty"),
        "peer_timeout": (["train.peer_timeout_s=0"], "train.peer_timeout_s must be positive, got 0.0"),
        # data
        "data_missing": (["data.source=text", f"data.path={tmp}/nope"], f"data.path '{tmp}/nope' does not exist"),
        "data_empty": (["data.source=text", f"data.path={tmp}/empty"], f"data.path '{tmp}/empty' is an empty folder"),
        "data_not_utf8": (["data.source=text", f"data.path={tmp}/t"],
                          f"{tmp}/t/a.txt: not UTF-8 (byte 0xe9 at byte offset 3)"),
        "jsonl_no_field": (["data.source=jsonl", f"data.path={tmp}/d.jsonl"],
                           f"{tmp}/d.jsonl:1: no field 'text' in this object"),
        "jsonl_bad_line": (["data.source=jsonl", f"data.path={tmp}/bad.jsonl"], f"{tmp}/bad.jsonl:2: invalid JSON"),
        "too_long": (["data.long_policy=error", "data.documents=files"], "document "),
        # checkpoint
        "ckpt_corrupt": ([], f"checkpoint {tmp}/w/checkpoints/2 is unreadable"),
        "ckpt_shape": (["model.d_model=96"], f"checkpoint {tmp}/w/checkpoints/2 is from another model "
                                             "(model.d_model: checkpoint 64, config 96"),
        "ckpt_dtype": (["model.param_dtype=bfloat16"], f"checkpoint {tmp}/w/checkpoints/2 is from another model "
                                                       "(model.param_dtype: checkpoint 'float32', config 'bfloat16')"),
        "init_from_missing": ([f"train.init_from={tmp}/nope"],
                              f"train.init_from '{tmp}/nope' is not a readable parameter checkpoint ("),
        "init_from_corrupt": ([f"train.init_from={tmp}/params"],
                              f"train.init_from '{tmp}/params' is not a readable parameter checkpoint ("),
        "init_from_other_model": ([f"train.init_from={tmp}/params"],
                                  f"train.init_from '{tmp}/params': parameter ['embed'] is (10, 4) float32, the "
                                  "model needs (264, 64) float32: use the config the import wrote, or another "
                                  "init_from"),
        # command line
        "set_syntax": (["train.steps"], "bad --set 'train.steps': expected dotted.key=value"),
        "set_yaml": (["model.n_layers=[1"], "model.n_layers: expected an integer, got '[1'"),  # taken as text
    }
    flags = {
        "unknown_flag": (["--bogus"], "unrecognized arguments: --bogus"),
        "steps_zero": (["--steps", "0"], "--steps must be positive, got 0"),
        "steps_not_int": (["--steps", "x"], "argument --steps: invalid int value: 'x'"),
        "config_missing": (["--config", f"{tmp}/missing.yaml"], f"config file '{tmp}/missing.yaml' not found"),
        "config_not_mapping": (["--config", f"{tmp}/list.yaml"], f"config file '{tmp}/list.yaml' must hold a mapping"),
        "workdir_is_file": (["--workdir", f"{tmp}/file"], f"--workdir '{tmp}/file' is a file"),
        "processes_without_coordinator": (["--num-processes", "2", "--process-id", "1"],
                                          "--num-processes 2 / --process-id 1 need --coordinator HOST:PORT"),
        "process_id_too_big": (["--coordinator", "127.0.0.1:1234", "--num-processes", "2", "--process-id", "2"],
                               "--process-id must be in 0..1 for --num-processes 2, got 2"),
        "coordinator_format": (["--coordinator", "host-without-port", "--num-processes", "2", "--process-id", "0"],
                               "--coordinator 'host-without-port': expected HOST:PORT"),
        "coordinator_alone": (["--coordinator", "127.0.0.1:1234"], "--coordinator needs --num-processes N"),
    }
    (tmp / "empty").mkdir()
    (tmp / "t").mkdir()
    (tmp / "t" / "a.txt").write_bytes("caf\xe9".encode("latin-1"))
    (tmp / "d.jsonl").write_text('{"body": "hello"}\n')
    (tmp / "bad.jsonl").write_text('{"text": "fine"}\n{oops\n')
    (tmp / "list.yaml").write_text("- model\n- data\n")
    (tmp / "file").write_text("not a folder\n")
    if kind == "ckpt_corrupt":
        _corrupt(tmp / "w")
    if kind in ("init_from_corrupt", "init_from_other_model"):
        import numpy as np
        from dysejax.checkpoint import save_params
        save_params(str(tmp / "params"), {"embed": np.zeros((10, 4), np.float32)})
        if kind == "init_from_corrupt":
            truncate_files(tmp / "params")
    if kind in sets:
        extra, message = sets[kind]
        return ["--set", *extra], message
    return flags[kind]


# the fix the line ends with, where the start above leaves it out
FIXES = {"ckpt_corrupt": ": move it away or use another --workdir",
         "ckpt_shape": ": use another --workdir or restore the matching config",
         "ckpt_dtype": ": use another --workdir or restore the matching config"}

KINDS = ["unknown_key", "wrong_type", "impossible_mesh", "heads_vs_tp", "bucket_vs_sp", "no_plan_fits",
         "plan_not_a_bucket", "unknown_strategy", "plan_short", "empty_buckets", "peer_timeout", "data_missing", "data_empty",
         "data_not_utf8", "jsonl_no_field", "jsonl_bad_line", "too_long", "ckpt_corrupt", "ckpt_shape", "ckpt_dtype",
         "init_from_missing", "init_from_corrupt", "init_from_other_model",
         "set_syntax", "set_yaml", "unknown_flag", "steps_zero", "steps_not_int", "config_missing", "config_not_mapping",
         "workdir_is_file", "processes_without_coordinator", "process_id_too_big", "coordinator_format",
         "coordinator_alone"]


@pytest.mark.parametrize("kind", KINDS)
def test_bad_input_is_one_error_line_exit_2_and_leaves_the_workdir(kind, tmp_path, trained, capsys):
    extra, message = _case(kind, tmp_path, trained)
    work = tmp_path / "w"
    argv = ["--config", TINY, "--workdir", str(work), "--steps", "4", "--set", *FAST, "train.checkpoint_every=2"]
    if "--workdir" in extra:  # a later flag of the same name wins
        work = extra[extra.index("--workdir") + 1]
    before = snapshot(work)
    capsys.readouterr()
    try:
        status = train.main(argv + extra if extra[:1] != ["--set"] else argv + extra[1:])
    except SystemExit as e:  # argparse's usage errors
        status = e.code
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert status == 2, err
    assert len(lines) == 1 and lines[0].startswith(f"error: {message}"), err
    assert FIXES.get(kind, "") in lines[0], err
    assert snapshot(work) == before, f"{kind}: the workdir changed"
