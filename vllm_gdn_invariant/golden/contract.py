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
    require_tensor(
        state_indices, name, ndim=1, dtypes=INDEX_DTYPES, device=device, device_of=device_of
    )
    require_shape(state_indices, name, (batch,), "[B]")
    indices = state_indices.to(torch.int64)
    active = indices > 0
    blocks = indices[active]
    out_of_range = blocks >= num_blocks
    if bool(out_of_range.any()):
        bad = blocks[out_of_range].tolist()
        raise ValueError(
            f"{name} has active indices {bad} out of range for num_blocks={num_blocks}"
        )
    unique_blocks, counts = torch.unique(blocks, return_counts=True)
    if bool((counts > 1).any()):
        repeated = unique_blocks[counts > 1].tolist()
        raise ValueError(f"{name} repeats active indices {repeated}; each block has one writer")
    rows = torch.arange(batch, device=indices.device)[active]
    return ActiveRows(rows=rows, blocks=blocks)
