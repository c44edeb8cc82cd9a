"""The data pipeline: source -> train/eval split -> long-document policy -> packed batch plans.

    pipe = DataPipeline(cfg.data, seed=cfg.train.seed, batch_multiple=devices * grad_accum, batch_unit=grad_accum)
    pipe.buckets, pipe.batch_sizes, pipe.batch_size(L)
    it = pipe.train_iterator(state=None)    # or a saved it.state(): {"epoch": e, "index": i}
    plan = it.next_plan()                   # BatchPlan (metadata only); advances the state
    batch = pipe.materialize(plan, rows=None)  # Batch; rows=slice(lo, hi) builds only those rows
    batch = next(it)                        # = pipe.materialize(it.next_plan())
    pipe.epoch_plans(e), pipe.eval_plans()  # all plans of epoch e; the fixed eval batches (per bucket)
    pipe.report, pipe.summary()             # counts (documents, long-document policy, ...), one line

Epoch e is a pure function of (seed, e): the train documents are shuffled with
np.random.default_rng([seed, e]), cut by the long-document policy, packed, and the batches
interleaved across buckets (`order.interleave`: every prefix of an epoch has about the epoch's
bucket mix). Epochs roll over forever; every train document is seen once per epoch.
"""
from __future__ import annotations

import shutil
import tempfile
import threading
import weakref
from collections import OrderedDict
from typing import Callable, Optional

import numpy as np

from dysejax.config import DataConfig
from dysejax.data.batch import Batch, materialize
from dysejax.data.bucketing import batch_size, check_long, expand
from dysejax.data.order import interleave
from dysejax.data.packing import BatchPlan, pack
from dysejax.data import prepare
from dysejax.data.sources import Source
from dysejax.data.split import eval_mask
from dysejax.data.tokenizer import Tokenizer
from dysejax.errors import DataError

_EPOCH_CACHE = 2


def open_source(cfg: DataConfig, seed: int = 0, tokenizer: Optional[Tokenizer] = None,
                cache_dir: Optional[str] = None) -> Source:
    """The token source `cfg.source` names, capped at cfg.max_docs documents (byte tokens by default)."""
    tokenizer = tokenizer or prepare.build_tokenizer(cfg, None, seed, cache_dir)
    return prepare.open_source(cfg, seed, tokenizer, cache_dir)


class DataPipeline:
    """Batches of one data config; see the module docstring for the whole API.

    The tokenizer is `tokenizer`, else the one `cfg.tokenizer` names (`bpe` needs `vocab_size`);
    token caches and a trained BPE go to `cache_dir` (default: a temporary folder that lives as
    long as the pipeline).
    """

    def __init__(self, cfg: DataConfig, seed: int = 0, batch_multiple: int = 1,
                 source: Optional[Source] = None, tokenizer: Optional[Tokenizer] = None,
                 cache_dir: Optional[str] = None, vocab_size: Optional[int] = None,
                 log: Optional[Callable[[str], None]] = None, batch_unit: Optional[int] = None):
        """Batch sizes are multiples of `batch_multiple` where the token budget allows, else
        divisors of it that are multiples of `batch_unit` (default: always `batch_multiple`)."""
        if batch_multiple < 1:
            raise ValueError(f"batch_multiple must be >= 1, got {batch_multiple}")
        self.cfg, self.seed, self.batch_multiple = cfg, int(seed), int(batch_multiple)
        self.batch_unit = self.batch_multiple if batch_unit is None else int(batch_unit)
        self.buckets = cfg.bucket_lengths()
        if not self.buckets:
            raise DataError("data.buckets describes no bucket: give lengths, e.g. [128, 256], or min <= max")
        self.batch_sizes = [self.batch_size(L) for L in self.buckets]
        if cache_dir is None and source is None:
            cache_dir = tempfile.mkdtemp(prefix="dysejax-data-")
            weakref.finalize(self, shutil.rmtree, cache_dir, True)
        self.tokenizer = tokenizer or prepare.build_tokenizer(cfg, vocab_size, self.seed, cache_dir, log)
        self.source = source if source is not None else prepare.open_source(cfg, self.seed, self.tokenizer,
                                                                             cache_dir, log)
        self.max_bucket = self.buckets[-1]
        lengths = self.source.lengths
        long = check_long(self.source.keys, lengths, self.max_bucket, cfg.long_policy)
        usable = lengths <= self.max_bucket + 1 if cfg.long_policy == "skip" else None
        in_eval = eval_mask(self.source.keys, self.seed, cfg.eval_fraction, usable)
        self.train_docs = np.flatnonzero(~in_eval)
        self.eval_docs = np.flatnonzero(in_eval)
        kept = expand(self.train_docs, lengths, self.max_bucket, cfg.long_policy)[0]
        if not len(kept):
            raise DataError(self._no_train_message(len(lengths), int(in_eval.sum())))
        self.report = {
            "source": self.source.name, "documents": int(len(lengths)),
            "train_documents": int(len(self.train_docs)), "eval_documents": int(len(self.eval_docs)),
            "tokens": int(lengths.sum()), **long,
            "buckets": list(self.buckets), "batch_sizes": list(self.batch_sizes),
        }
        self._epochs: OrderedDict[int, list[BatchPlan]] = OrderedDict()
        self._eval: Optional[list[BatchPlan]] = None
        self._lock = threading.Lock()  # a prefetch thread may plan while the trainer asks

    def _no_train_message(self, n_docs: int, n_eval: int) -> str:
        if self.cfg.long_policy == "skip" and n_docs > n_eval:
            return (f"all {n_docs - n_eval} training documents are longer than the largest bucket "
                    f"{self.max_bucket} and data.long_policy=skip drops them: use split or truncate, "
                    "or add a larger bucket")
        return (f"no training documents: all {n_docs} of {self.source.describe()} went to eval "
                f"(data.eval_fraction={self.cfg.eval_fraction}): add documents or lower data.eval_fraction")

    def batch_size(self, length: int) -> int:
        """Rows per batch of bucket `length`."""
        return batch_size(length, self.cfg.tokens_per_batch, self.batch_multiple, self.batch_unit)

    def _pack(self, docs: np.ndarray) -> list[BatchPlan]:
        pieces = expand(docs, self.source.lengths, self.max_bucket, self.cfg.long_policy)
        return pack(*pieces, self.buckets, self.batch_sizes, self.cfg.pack, self.cfg.pack_across_buckets)

    def epoch_plans(self, epoch: int) -> list[BatchPlan]:
        """All train BatchPlans of `epoch`, in order (a pure function of seed and epoch)."""
        with self._lock:
            if epoch not in self._epochs:
                docs = np.random.default_rng([self.seed, int(epoch)]).permutation(self.train_docs)
                self._epochs[epoch] = interleave(self._pack(docs), np.random.default_rng([self.seed, int(epoch), 1]))
                while len(self._epochs) > _EPOCH_CACHE:
                    self._epochs.popitem(last=False)
            self._epochs.move_to_end(epoch)
            return self._epochs[epoch]

    def eval_plans(self) -> list[BatchPlan]:
        """The first data.eval_batches BatchPlans of each bucket of the eval split (fixed; fewer
        where the split is small), so that every bucket's held-out loss is measured."""
        if self._eval is None:
            n = self.cfg.eval_batches
            plans = self._pack(self.eval_docs) if len(self.eval_docs) and n else []
            taken: dict[int, int] = {}
            self._eval = []
            for plan in plans:
                if taken.get(plan.bucket, 0) < n:
                    taken[plan.bucket] = taken.get(plan.bucket, 0) + 1
                    self._eval.append(plan)
        return self._eval

    def materialize(self, plan: BatchPlan, rows: Optional[slice] = None) -> Batch:
        """The arrays of `plan`, or only of its rows `rows` (e.g. this process's share)."""
        return materialize(plan, self.source.read, rows, self.tokenizer.pad_id)

    def train_iterator(self, state: Optional[dict] = None) -> "DataIterator":
        """An endless iterator over train batches, from the start or from a saved state."""
        return DataIterator(self, state)

    def summary(self) -> str:
        """One line for the log: documents, split, long-document policy, buckets, epoch-0 packing."""
        r = self.report
        plans = self.epoch_plans(0)
        slots = sum(p.batch_size * p.bucket for p in plans)
        fill = sum(p.real_tokens for p in plans) / slots
        action = {"split": f"split into {r['chunks_created']} chunks",
                  "truncate": f"truncated, {r['tokens_dropped']} tokens dropped",
                  "skip": f"skipped, {r['tokens_dropped']} tokens dropped", "error": ""}[r["long_policy"]]
        long = (f"{r['long_documents']} docs > {self.max_bucket + 1} tokens {action}" if r["long_documents"]
                else f"no doc > {self.max_bucket + 1} tokens")
        sizes = ", ".join(f"{L}x{b}" for L, b in zip(self.buckets, self.batch_sizes))
        return (f"data: {self.source.describe()}: {r['documents']} docs, {r['tokens']} tokens "
                f"({r['train_documents']} train / {r['eval_documents']} eval); {long} "
                f"(long_policy={r['long_policy']}); buckets Lxbatch {sizes}; "
                f"{'packed' if self.cfg.pack else 'unpacked'}, {len(plans)} train batches/epoch, "
                f"{fill:.1%} of slots real; {len(self.eval_plans())} eval batches")


class DataIterator:
    """Train batches forever; `state()` is JSON-able and restores the exact continuation."""

    def __init__(self, pipeline: DataPipeline, state: Optional[dict] = None):
        self.pipeline = pipeline
        self.epoch, self.index = _parse_state(state)
        n = len(pipeline.epoch_plans(self.epoch))
        if self.index > n:
            raise DataError(f"data iterator state {state} points past the {n} batches of epoch {self.epoch}: "
                            "the data or data config changed since it was saved; restore with the same data "
                            "config or start the data from state None")

    def state(self) -> dict:
        """{"epoch": e, "index": i}: the next plan is epoch e's plan i."""
        return {"epoch": self.epoch, "index": self.index}

    def next_plan(self) -> BatchPlan:
        """The next BatchPlan (metadata only); advances the state, rolling over epochs."""
        plans = self.pipeline.epoch_plans(self.epoch)
        if self.index >= len(plans):
            self.epoch, self.index = self.epoch + 1, 0
            plans = self.pipeline.epoch_plans(self.epoch)
        plan = plans[self.index]
        self.index += 1
        return plan

    def __iter__(self):
        return self

    def __next__(self) -> Batch:
        return self.pipeline.materialize(self.next_plan())


def _parse_state(state: Optional[dict]) -> tuple[int, int]:
    if state is None:
        return 0, 0
    ok = isinstance(state, dict) and set(state) == {"epoch", "index"} and all(
        isinstance(state[k], int) and not isinstance(state[k], bool) and state[k] >= 0 for k in state)
    if not ok:
        raise DataError(f"bad data iterator state {state!r}: expected {{'epoch': int >= 0, 'index': int >= 0}} "
                        "as saved by DataIterator.state()")
    return state["epoch"], state["index"]
