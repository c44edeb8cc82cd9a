"""Per-step metrics: `WORKDIR/metrics.jsonl` (one JSON object per row), optionally TensorBoard
(`WORKDIR/tensorboard`) and Weights & Biases (offline by default: `WORKDIR/wandb`).

TensorBoard and W&B get every numeric field of a row, and the per-bucket figures again under
`<name>/bucket_<length>` so each bucket has its own curve."""
from __future__ import annotations

import json
import os
from typing import Optional

from dysejax.errors import ConfigError


class MetricsWriter:
    """Appends rows to metrics.jsonl; on resume, drops rows past the restored step first."""

    def __init__(self, workdir: str, enabled: bool = True, tensorboard: bool = False,
                 wandb: Optional[dict] = None):
        """`wandb`: None, or the keyword arguments of `wandb.init` (project, mode, config, name)."""
        self.path = os.path.join(workdir, "metrics.jsonl")
        self.enabled = enabled
        self._tb = self._wandb = None
        if enabled and tensorboard:
            try:
                from tensorboardX import SummaryWriter
            except ImportError:
                raise ConfigError("train.tensorboard needs tensorboardX: pip install 'dysejax[tensorboard]' "
                                  "or set train.tensorboard=false") from None
            self._tb = SummaryWriter(os.path.join(workdir, "tensorboard"))
        if enabled and wandb is not None:
            try:
                import wandb as wandb_lib
            except ImportError:
                raise ConfigError("train.wandb needs wandb: pip install 'dysejax[wandb]' or set train.wandb=false") from None
            self._wandb = wandb_lib.init(dir=workdir, **wandb)

    def truncate_after(self, step: int) -> None:
        """Keep only rows with `step` <= the given step (those past it will be recomputed)."""
        if not self.enabled or not os.path.exists(self.path):
            return
        kept = [line for line in read_rows(self.path, raw=True) if json.loads(line)["step"] <= step]
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            f.writelines(line + "\n" for line in kept)
        os.replace(tmp, self.path)

    def write(self, row: dict) -> None:
        if not self.enabled:
            return
        with open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")
        if self._tb is None and self._wandb is None:
            return
        scalars = scalars_of(row)
        if self._tb is not None:
            for key, value in scalars.items():
                self._tb.add_scalar(key, value, row["step"])
        if self._wandb is not None:
            self._wandb.log(scalars, step=row["step"])

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()


PER_BUCKET = ("tokens_per_s", "bucket_tokens_per_s", "mfu", "step_time_s")


def scalars_of(row: dict) -> dict:
    """The numeric fields of a row (not `step`), plus the per-bucket ones as `<name>/bucket_<length>`."""
    out = {k: float(v) for k, v in row.items()
           if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "step"}
    for key in PER_BUCKET:
        if key in out and "bucket" in row:
            out[f"{key}/bucket_{row['bucket']}"] = out[key]
    return out


def read_rows(path: str, raw: bool = False) -> list:
    """Rows of a metrics.jsonl file (a torn last line from a kill is ignored)."""
    rows = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                parsed = json.loads(line)
            except json.JSONDecodeError:
                continue
            rows.append(line if raw else parsed)
    return rows


def read_metrics(workdir: str, kind: Optional[str] = None) -> list[dict]:
    """metrics.jsonl rows of a workdir; kind='train' or 'eval' filters by the presence of eval_loss."""
    rows = read_rows(os.path.join(workdir, "metrics.jsonl"))
    if kind == "eval":
        return [r for r in rows if "eval_loss" in r]
    if kind == "train":
        return [r for r in rows if "loss" in r]
    return rows
