"""Per-step metrics: `WORKDIR/metrics.jsonl` (one JSON object per row), optional TensorBoard."""
from __future__ import annotations

import json
import os
from typing import Optional

from dysejax.errors import ConfigError


class MetricsWriter:
    """Appends rows to metrics.jsonl; on resume, drops rows past the restored step first."""

    def __init__(self, workdir: str, enabled: bool = True, tensorboard: bool = False):
        self.path = os.path.join(workdir, "metrics.jsonl")
        self.enabled = enabled
        self._tb = None
        if enabled and tensorboard:
            try:
                from tensorboardX import SummaryWriter
            except ImportError:
                raise ConfigError("train.tensorboard needs tensorboardX: pip install 'dysejax[tensorboard]' "
                                  "or set train.tensorboard=false") from None
            self._tb = SummaryWriter(os.path.join(workdir, "tensorboard"))

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
        if self._tb is not None:
            for key, value in row.items():
                if isinstance(value, (int, float)) and key != "step":
                    self._tb.add_scalar(key, value, row["step"])

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()


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
