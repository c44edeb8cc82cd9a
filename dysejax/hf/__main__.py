"""python -m dysejax.hf import HF_DIR --workdir W [--buckets 128 256 ...] | export --workdir W OUT_DIR [--step N]"""
from __future__ import annotations

import argparse
import os
import shlex
import sys

TRAIN_PY = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "train.py")


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        sys.stderr.write(f"error: {message} (see --help)\n")
        raise SystemExit(2)


def continue_command(config_path: str) -> str:
    """The shell command that trains the import at `config_path` further, from any directory."""
    workdir = os.path.dirname(os.path.abspath(config_path))
    train = TRAIN_PY if os.path.isfile(TRAIN_PY) else "train.py"  # an installed package has no train.py
    return " ".join(shlex.quote(a) for a in ("python", train, "--config", os.path.abspath(config_path),
                                              "--workdir", workdir))


def main(argv=None) -> int:
    p = _Parser(prog="python -m dysejax.hf", description="Hugging Face Llama models in and out of dysejax.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    imp = sub.add_parser("import", help="a Llama folder (config.json + safetensors) -> a dysejax workdir")
    imp.add_argument("hf_dir", help="Hugging Face model folder")
    imp.add_argument("--workdir", required=True, help="new or empty folder for the config and parameters")
    imp.add_argument("--buckets", type=int, nargs="+", help="bucket lengths of the written config (default 128 256 512)")
    exp = sub.add_parser("export", help="a dysejax workdir -> a folder transformers loads")
    exp.add_argument("--workdir", required=True, help="a training run's or an import's workdir")
    exp.add_argument("out_dir", help="new or empty output folder")
    exp.add_argument("--step", type=int, help="checkpoint step (default: the latest, else the imported parameters)")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)

    import dysejax
    from dysejax.hf import export_model, import_model

    try:
        if args.command == "import":
            path = import_model(args.hf_dir, args.workdir, args.buckets)
            print(f"imported {args.hf_dir} -> {path}\ncontinue training: {continue_command(path)}")
        else:
            what = export_model(args.workdir, args.out_dir, args.step)
            print(f"exported {what} of {args.workdir} -> {args.out_dir}")
    except dysejax.UserError as e:
        sys.stderr.write(f"error: {e}\n")
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
