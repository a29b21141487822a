"""Validation of the GDN cache-state contract shared by the recurrent step and the conv update.

The contract:

* Indices (``state_indices``) are a 1-D int32 or int64 tensor with one entry per batch row, on
  the same device as the data. Row ``i`` reads and writes cache block ``state_indices[i]``.
* An index <= 0 marks an inactive row: its output row is zeros and no block is read or written.
  Inactive indices may repeat. Block 0 is vLLM's null block and is never written.
* An active index must be < ``num_blocks`` and must not repeat (two rows writing one block would
  make the result depend on write order).
* Shapes, dtypes and devices of every argument are checked before anything is computed; a
  violation raises ``ValueError`` (bad value or shape) or ``TypeError`` (bad type or dtype) whose
  message names the argument.

Checking the index values (``check_state_index_values``) is the one check that reads tensor
values back from their device (one read of two flags when they pass); every other check
(``require_state_indices``, and the ops' ``check_*_dims``) looks at metadata only.
"""

from dataclasses import dataclass
from numbers import Integral, Real

import torch
from torch import Tensor

FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
STATE_DTYPES = (torch.float32, torch.bfloat16)
CONV_STATE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
INDEX_DTYPES = (torch.int32, torch.int64)


@dataclass(frozen=True)
class ActiveRows:
    """Batch positions of the active rows and the cache block each of them owns (int64)."""

    rows: Tensor
    blocks: Tensor


def require_tensor(
    value: object,
    name: str,
    *,
    ndim: int,
    dtypes: tuple[torch.dtype, ...],
    device: torch.device | None = None,
    device_of: str = "the data",
) -> Tensor:
    """Check that ``value`` is a tensor with ``ndim`` dims, a dtype in ``dtypes``, on ``device``.

    ``device_of`` names the argument that ``device`` was taken from, for the message.
    """
    if not isinstance(value, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if value.dtype not in dtypes:
        allowed = ", ".join(str(d) for d in dtypes)
        raise TypeError(f"{name} must have dtype in ({allowed}), got {value.dtype}")
    if value.ndim != ndim:
        raise ValueError(
            f"{name} must be {ndim}-D, got {value.ndim}-D with shape {tuple(value.shape)}"
        )
    if device is not None and value.device != device:
        raise ValueError(f"{name} is on {value.device}, but {device_of} is on {device}")
    return value


def require_shape(value: Tensor, name: str, expected: tuple[int, ...], meaning: str) -> None:
    """Check ``value.shape == expected``; ``meaning`` spells the expected shape symbolically."""
    if tuple(value.shape) != tuple(expected):
        raise ValueError(
            f"{name} must have shape {meaning} = {tuple(expected)}, got {tuple(value.shape)}"
        )


def require_positive_int(value: object, name: str) -> int:
    """Check that ``value`` is an integer (not bool) and > 0."""
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value <= 0:
        raise ValueError(f"{name} must be > 0, got {value}")
    return int(value)


def require_real(value: object, name: str) -> float:
    """Check that ``value`` is a finite real number (not bool)."""
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__} {value!r}")
    if value != value or value in (float("inf"), float("-inf")):
        raise ValueError(f"{name} must be finite, got {value}")
    return float(value)


def require_bool(value: object, name: str) -> bool:
    """Check that ``value`` is a bool."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__} {value!r}")
    return value


def require_state_indices(
    state_indices: object,
    *,
    batch: int,
    device: torch.device,
    device_of: str,
    name: str = "state_indices",
) -> Tensor:
    """Check the indices' type, dtype, rank, device and length; no value is read."""
    require_tensor(
        state_indices, name, ndim=1, dtypes=INDEX_DTYPES, device=device, device_of=device_of
    )
    require_shape(state_indices, name, (batch,), "[B]")
    return state_indices


def check_state_index_values(
    state_indices: Tensor, *, num_blocks: int, name: str = "state_indices"
) -> None:
    """Check that the active indices are < ``num_blocks`` and do not repeat.

    Reads one verdict (two flags) back from the indices' device; a failing check reads the
    offending values too, to name them. The indices passed ``require_state_indices``.
    """
    indices = state_indices.to(torch.int64)
    active = indices > 0
    out_of_range = (active & (indices >= num_blocks)).any()
    # Inactive rows get distinct negative keys, so only repeated active indices meet after sorting.
    inactive_keys = -1 - torch.arange(indices.numel(), device=indices.device)
    keys = torch.where(active, indices, inactive_keys).sort().values
    repeated = (keys[1:] == keys[:-1]).any()
    has_out_of_range, has_repeats = torch.stack((out_of_range, repeated)).tolist()
    if has_out_of_range:
        blocks = indices[active]
        bad = blocks[blocks >= num_blocks].tolist()
        raise ValueError(
            f"{name} has active indices {bad} out of range for num_blocks={num_blocks}"
        )
    if has_repeats:
        unique_blocks, counts = torch.unique(indices[active], return_counts=True)
        repeated_blocks = unique_blocks[counts > 1].tolist()
        raise ValueError(
            f"{name} repeats active indices {repeated_blocks}; each block has one writer"
        )


def active_rows(state_indices: Tensor) -> ActiveRows:
    """The batch positions whose index is > 0 and their blocks (checked indices)."""
    indices = state_indices.to(torch.int64)
    active = indices > 0
    rows = torch.arange(indices.numel(), device=indices.device)[active]
    return ActiveRows(rows=rows, blocks=indices[active])


def validate_state_indices(
    state_indices: object,
    *,
    batch: int,
    num_blocks: int,
    device: torch.device,
    device_of: str,
    name: str = "state_indices",
) -> ActiveRows:
    """Check the indices against the contract and return the active rows and their blocks."""
    require_state_indices(state_indices, batch=batch, device=device, device_of=device_of, name=name)
    check_state_index_values(state_indices, num_blocks=num_blocks, name=name)
    return active_rows(state_indices)
