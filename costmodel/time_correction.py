"""Measured corrections of the time model, per option (strategy x remat policy) of one model.

The device rates of `costmodel.time` price every option alike, but the devices here may run an
option's programs faster or slower than its FLOPs and bytes say (thread scheduling of simulated
CPU devices, fused kernels, loop overheads, recompute that overlaps). `OptionTimes` holds layer
seconds measured on the devices here per option at a few (batch, length) shapes of one model and
corrects the model's prediction at any shape of that model as

    t(option, shape) = a * attention(shape) + b * rest(shape)

(`LayerTime.attention` / `LayerTime.rest`): the attention part grows with the length at fixed
tokens and the rest does not, so two lengths determine (a, b) >= 0 (fitted in relative error)
and the correction extrapolates with the model's own shape. With one point, or when the points
cannot tell the parts apart (a scale at 0 although its part carries >= 10% of a prediction, or
the parts' ratio is the same at every point), the option gets one scale on its whole time and
`fit` says so. An option measured nowhere takes the median scale of its strategy's measured
options, else of all measured options (`how` = "borrowed").
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Callable, Mapping, Optional, Sequence

import numpy as np

MIN_PART = 0.10  # a part carrying at least this share of a prediction must get a nonzero scale


@dataclass(frozen=True)
class Scales:
    """Scales of one option's predicted attention and rest parts, and how they were found:
    "two-part" (both determined), "one-scale" (a single factor on the whole time, with the
    reason), or "borrowed" (not measured: another option's scale)."""

    attention: float
    rest: float
    how: str

    def apply(self, attention_s: float, rest_s: float) -> float:
        return self.attention * attention_s + self.rest * rest_s


def fit_scales(parts: Sequence[tuple[float, float]], measured: Sequence[float]) -> Scales:
    """(a, b) >= 0 with a * attention + b * rest ~ measured, in relative error (see module)."""
    from scipy.optimize import nnls
    P = np.asarray(parts, dtype=float).reshape(-1, 2)
    m = np.asarray(measured, dtype=float)
    total = P.sum(axis=1)
    one = float(np.exp(np.mean(np.log(m / total))))  # geometric mean of measured / predicted
    if len(m) < 2:
        return Scales(one, one, "one-scale: measured at one shape")
    share = P[:, 0] / total
    if np.ptp(share) < 0.02:
        return Scales(one, one, "one-scale: the attention share is the same at every measured shape")
    (a, b), _ = nnls(P / m[:, None], np.ones_like(m))
    weak = [name for name, scale, col in (("attention", a, 0), ("rest", b, 1))
            if scale <= 0 and np.max(P[:, col] / total) >= MIN_PART]
    if weak:
        return Scales(one, one, f"one-scale: the fit gave the {weak[0]} part no time")
    return Scales(float(a), float(b), "two-part")


@dataclass
class OptionTimes:
    """Measured layer seconds of one model per option label ("strategy@remat"): points
    [[batch, seq_len, seconds per layer], ...], for the layer `spec` (a BlockSpec as a dict)."""

    spec: dict
    points: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"spec": dict(self.spec), "points": {k: [list(p) for p in v] for k, v in self.points.items()}}

    @classmethod
    def from_json(cls, d: Mapping) -> "OptionTimes":
        return cls(spec=dict(d["spec"]), points={k: [list(p) for p in v] for k, v in d["points"].items()})

    def serves(self, spec) -> bool:
        """Whether these measurements are of this layer shape."""
        return asdict(spec) == self.spec

    def fit(self, parts_at: Callable[[str, str, int, int], tuple[float, float]]) -> dict[str, Scales]:
        """Scales per measured option; `parts_at(strategy, remat, batch, seq_len)` gives the
        model's (attention, rest) seconds of one layer."""
        out = {}
        for label, pts in self.points.items():
            strategy, remat = split_label(label)
            out[label] = fit_scales([parts_at(strategy, remat, int(b), int(s)) for b, s, _ in pts],
                                    [float(t) for _, _, t in pts])
        return out


def borrowed(label: str, fitted: Mapping[str, Scales]) -> Optional[Scales]:
    """The scales of an option measured nowhere: per part, the median over its strategy's
    measured options, else over all measured options (None when nothing was measured)."""
    if not fitted:
        return None
    strategy, _ = split_label(label)
    same = [s for k, s in fitted.items() if split_label(k)[0] == strategy] or list(fitted.values())
    return Scales(float(np.median([s.attention for s in same])), float(np.median([s.rest for s in same])),
                  "borrowed")


def label_of(strategy: str, remat: str) -> str:
    return f"{strategy}@{remat}"


def split_label(label: str) -> tuple[str, str]:
    strategy, _, remat = label.partition("@")
    return strategy, remat or "none"
