"""Synthetic documents: lengths drawn from a named distribution, tokens from real code.

`sample_lengths` draws token lengths (EOS included) deterministically from an rng:
`githubcode` and `grch38` follow the ParaDySe length histograms (bins <4K, 4-8K, 8-16K,
16-32K, 32-64K, 64-128K, >=128K tokens; log-uniform inside a bin, the last bin up to max_len),
`lognormal` (mu, sigma of log length) and `pareto` (min_len * (1 + Pareto(alpha))); all are
clipped to [min_len, max_len]. `SyntheticSource` gives each document a consecutive, cyclic slice
of the concatenated standard library (so the tokens are learnable), and knows every length
without reading anything: benchmarks can plan batches at any length from metadata alone.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from dysejax.config import SyntheticConfig
from dysejax.data.sources import stdlib_corpus
from dysejax.data.tokenizer import EOS_ID
from dysejax.errors import DataError

K = 1024
BIN_EDGES = (0, 4 * K, 8 * K, 16 * K, 32 * K, 64 * K, 128 * K)  # lower edges; the last bin is open
BIN_FRACTIONS = {  # share of sequences per bin (REFERENCES.md section 1), normalised to sum 1
    "githubcode": (0.657, 0.145, 0.098, 0.051, 0.027, 0.011, 0.011),
    "grch38": (0.035, 0.264, 0.287, 0.212, 0.119, 0.055, 0.019),
}
DISTRIBUTIONS = (*BIN_FRACTIONS, "lognormal", "pareto")
_SEED_SALT = 0x5E7  # keeps synthetic lengths independent of the shuffle stream of the same seed


def _binned(fractions, n: int, rng: np.random.Generator, min_len: int, max_len: int) -> np.ndarray:
    p = np.asarray(fractions, dtype=np.float64)
    bins = rng.choice(len(p), size=n, p=p / p.sum())
    lo_edges = np.asarray(BIN_EDGES, dtype=np.float64)
    hi_edges = np.append(lo_edges[1:], max_len + 1.0)  # exclusive upper edges
    lo = np.clip(lo_edges[bins], min_len, max_len)
    hi = np.clip(hi_edges[bins], lo + 1, max_len + 1)
    x = np.exp(rng.uniform(np.log(lo), np.log(hi)))
    return np.clip(np.floor(x), lo, hi - 1)


def sample_lengths(distribution: str, n: int, rng: np.random.Generator, *, min_len: int = 16,
                   max_len: int = 262144, mu: float = 7.0, sigma: float = 1.5,
                   alpha: float = 1.2) -> np.ndarray:
    """n document lengths (int64 tokens) from `distribution`, clipped to [min_len, max_len]."""
    if not 0 < min_len <= max_len:
        raise DataError(f"synthetic lengths need 0 < min_len <= max_len, got {min_len}, {max_len}: "
                        "fix data.synthetic.min_len / max_len")
    if distribution in BIN_FRACTIONS:
        x = _binned(BIN_FRACTIONS[distribution], n, rng, min_len, max_len)
    elif distribution == "lognormal":
        x = np.round(np.exp(rng.normal(mu, sigma, size=n)))
    elif distribution == "pareto":
        x = np.floor(min_len * (1.0 + rng.pareto(alpha, size=n)))
    else:
        raise DataError(f"unknown synthetic distribution {distribution!r}: "
                        f"set data.synthetic.distribution to one of {', '.join(DISTRIBUTIONS)}")
    return np.clip(x, min_len, max_len).astype(np.int64)


class SyntheticSource:
    """Documents with sampled lengths whose tokens are cyclic slices of the stdlib corpus + EOS."""

    name = "synthetic"

    def __init__(self, cfg: SyntheticConfig, seed: int, max_docs: Optional[int] = None):
        self.cfg = cfg
        n = cfg.num_docs if max_docs is None else min(cfg.num_docs, max_docs)
        rng = np.random.default_rng([seed, _SEED_SALT])
        self.lengths = sample_lengths(cfg.distribution, n, rng, min_len=cfg.min_len, max_len=cfg.max_len,
                                      mu=cfg.mu, sigma=cfg.sigma, alpha=cfg.alpha)
        self.keys = [f"synthetic:{i}" for i in range(n)]
        body = self.lengths - 1
        self.offsets = np.concatenate([[0], np.cumsum(body)[:-1]]).astype(np.int64)

    def describe(self) -> str:
        """Distribution and bounds."""
        c = self.cfg
        return f"synthetic {c.distribution} ({len(self.keys)} docs, lengths {c.min_len}..{c.max_len})"

    def read(self, i: int, start: int, end: int) -> np.ndarray:
        """int32 tokens[start:end] of document i (a corpus slice, then EOS)."""
        length = int(self.lengths[i])
        if not 0 <= start <= end <= length:
            raise IndexError(f"token range [{start}, {end}) outside synthetic document {i} of {length} tokens")
        corpus = stdlib_corpus()
        hi = min(end, length - 1)
        idx = (self.offsets[i] + np.arange(start, max(hi, start), dtype=np.int64)) % len(corpus)
        out = corpus[idx].astype(np.int32)
        return np.append(out, np.int32(EOS_ID)) if end == length else out
