"""Remat policies as data: what a layer's backward keeps, what it computes again.

A plan run names one of these (`[strategy, n_layers, remat]`); the stack and the pipeline wrap
each layer in `jax.checkpoint` with its `policy`, and the cost model reads the rest.

`selective` is Megatron-LM's selective recompute adapted to flash-style attention: the layer
keeps its input, the residual sum after attention, q / k / v, the attention output and its
log-sum-exp, and the MLP's pre-activations (the arrays marked with `keep`); norms, rotary
positions, the MLP's activation, weight casts and gathered weights or sub-layer inputs are
computed again in the backward. No matmul runs twice; attention runs twice only where it is
dense (short rows: its probabilities are not kept) or a fused kernel's residuals are unmarked.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import jax
from jax.ad_checkpoint import checkpoint_name

KEEP = "keep_for_backward"


def keep(x):
    """Mark `x` as one of the arrays the `selective` policy keeps for the backward."""
    return checkpoint_name(x, KEEP)


@dataclass(frozen=True)
class Remat:
    """One remat policy: the `jax.checkpoint` policy (None: no checkpoint, autodiff keeps every
    residual), the extra forward passes of the matmuls and of attention it costs, and whether
    arrays gathered in the forward (weights, sub-layer inputs) are kept or gathered again."""

    name: str
    policy: Optional[Callable]
    matmul_recompute: int
    attention_recompute: int
    keeps_gathered: bool


POLICIES = {
    "none": Remat("none", None, 0, 0, True),
    "selective": Remat("selective", jax.checkpoint_policies.save_only_these_names(KEEP), 0, 0, False),
    "dots": Remat("dots", jax.checkpoint_policies.dots_with_no_batch_dims_saveable, 0, 1, False),
    "full": Remat("full", jax.checkpoint_policies.nothing_saveable, 1, 1, False),
}
NAMES = tuple(POLICIES)
LEANEST = "full"  # keeps each layer's input only: the least memory of the policies


def remat_policy(name: str) -> Remat:
    """The policy called `name`; ValueError naming the known ones otherwise."""
    if name not in POLICIES:
        raise ValueError(f"remat must be one of {', '.join(NAMES)}, got {name!r}")
    return POLICIES[name]


def checkpointed(body: Callable, name: str) -> Callable:
    """`body` under the remat policy `name` (unchanged for `none`)."""
    policy = remat_policy(name).policy
    return body if policy is None else jax.checkpoint(body, policy=policy)
