"""Sparse constraint rows for `scipy.optimize.milp` (HiGHS), built one at a time."""
from __future__ import annotations

from typing import Sequence

__all__ = ["ConstraintRows"]


class ConstraintRows:
    """Sparse rows lb <= sum_i v_i x_{c_i} <= ub, built one at a time for `scipy.optimize.milp`."""

    def __init__(self):
        self.rows, self.cols, self.vals, self.lo, self.hi = [], [], [], [], []

    def add(self, cols: Sequence[int], vals: Sequence[float], lb: float, ub: float) -> None:
        """Append the row lb <= sum_i vals[i] x[cols[i]] <= ub."""
        r = len(self.lo)
        self.rows.extend([r] * len(cols))
        self.cols.extend(cols)
        self.vals.extend(vals)
        self.lo.append(lb)
        self.hi.append(ub)

    def constraint(self, n_vars: int):
        """The rows as one `scipy.optimize.LinearConstraint` over `n_vars` variables."""
        from scipy.optimize import LinearConstraint
        from scipy.sparse import coo_matrix
        A = coo_matrix((self.vals, (self.rows, self.cols)), shape=(len(self.lo), n_vars)).tocsr()
        return LinearConstraint(A, self.lo, self.hi)
