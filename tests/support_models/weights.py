"""Orthogonal ±1 vectors: the building block of every known-answer model here.

Each model in this package keeps the answer in a chain of vectors: the token (or token class) the model
is looking at has one row of a Hadamard matrix as its vector, and the layers map that row onto the row
of the token that comes next.  Rows of a Hadamard matrix are pairwise orthogonal, contain only +1 and
-1 (so an RMS or layer norm leaves them as they are: mean 0 once the all-ones row is skipped, mean
square 1), and their dot product with themselves is the width, which gives every wanted logit the same
margin over the others (which score 0).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt


def hadamard(n: int) -> npt.NDArray[np.float32]:
    """The n×n Sylvester Hadamard matrix (n a power of two): entries ±1, rows pairwise orthogonal."""
    if n < 1 or n & (n - 1):
        raise ValueError(f"a Sylvester Hadamard matrix needs a power of two, not {n}")
    matrix = np.ones((1, 1), dtype=np.float32)
    while matrix.shape[0] < n:
        matrix = np.block([[matrix, matrix], [matrix, -matrix]])
    return matrix


def chain_rows(width: int, count: int) -> npt.NDArray[np.float32]:
    """``count`` orthogonal ±1 rows of ``width`` entries, each summing to zero (all-ones row 0 skipped)."""
    if count > width - 1:
        raise ValueError(f"only {width - 1} zero-mean rows of width {width}, {count} asked")
    return hadamard(width)[1 : count + 1].copy()
