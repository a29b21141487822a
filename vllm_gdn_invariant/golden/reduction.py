"""The one fixed-order sum that every golden reduction uses.

Order, for a last dimension of length n: zero-pad it to P, the next power of two (P = 1 for
n = 1); then, while the width w is above 1, replace x[0:w] by x[0:w/2] + x[w/2:w], one
elementwise IEEE add per level. For n = 4 that is (x0 + x2) + (x1 + x3); for n = 5 (padded to 8)
it is ((x0 + x4) + (x2 + 0)) + ((x1 + 0) + (x3 + 0)). Each add is its own tensor op on slices of
the input, so a row's sum depends only on that row's values: not on the batch size, the other
rows, the device, or torch's reduction kernels. Adding a padding zero is exact (it can only turn
a -0 into +0).
"""

import torch
from torch import Tensor


def fixed_order_sum(x: Tensor) -> Tensor:
    """Sum over the last dimension in the fixed pairwise order described in the module docstring.

    Returns a tensor of shape ``x.shape[:-1]`` in ``x``'s dtype. An empty last dimension sums
    to zeros.
    """
    n = x.shape[-1]
    if n == 0:
        return torch.zeros(x.shape[:-1], dtype=x.dtype, device=x.device)
    width = 1 << (n - 1).bit_length()
    if width != n:
        pad = torch.zeros((*x.shape[:-1], width - n), dtype=x.dtype, device=x.device)
        x = torch.cat([x, pad], dim=-1)
    while width > 1:
        width //= 2
        x = x[..., :width] + x[..., width:]
    return x[..., 0]
