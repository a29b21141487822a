"""PyTorch goldens for the Gated DeltaNet decode step, with the cache-state contract.

``recurrent_step`` (recurrent.py) and ``conv_update`` (conv.py) are out-of-place references for
vLLM's packed recurrent decode kernel and causal-conv1d update. Their arithmetic is fixed
op by op: every reduction uses ``fixed_order_sum`` (reduction.py), every transcendental the fp32
IEEE sequences of elementary.py, so a row gives the same bits whatever else is in the batch and
on CPU or CUDA. The state contract (indices, inactive rows, validation) is in contract.py.
"""

from .contract import (
    ActiveRows,
    active_rows,
    check_state_index_values,
    require_state_indices,
    validate_state_indices,
)
from .conv import ConvArgs, ConvDims, check_conv_args, check_conv_dims, conv_update
from .elementary import exp, log1p, sigmoid, silu, softplus, sqrt
from .recurrent import (
    RecurrentArgs,
    RecurrentDims,
    check_recurrent_args,
    check_recurrent_dims,
    fp32_scale,
    recurrent_step,
)
from .reduction import fixed_order_sum

__all__ = [
    "ActiveRows",
    "ConvArgs",
    "ConvDims",
    "RecurrentArgs",
    "RecurrentDims",
    "active_rows",
    "check_conv_args",
    "check_conv_dims",
    "check_recurrent_args",
    "check_recurrent_dims",
    "check_state_index_values",
    "conv_update",
    "exp",
    "fixed_order_sum",
    "fp32_scale",
    "log1p",
    "recurrent_step",
    "require_state_indices",
    "sigmoid",
    "silu",
    "softplus",
    "sqrt",
    "validate_state_indices",
]
