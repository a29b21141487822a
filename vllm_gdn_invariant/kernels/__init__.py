"""Golden-matched Triton kernels of the GDN decode step: bitwise the goldens' results.

``recurrent_step`` (recurrent.py) and ``conv_update`` (conv.py) take the arguments of
``vllm_gdn_invariant.golden.recurrent_step`` / ``conv_update`` and return the same ``out``
bits; the state they update in place ends up bitwise equal to the golden's new state. Their
arithmetic is the goldens' (the golden module docstrings are the spec), written once in
elementary.py with the goldens' constants; validation.py makes the goldens' checks before
anything is written. Every launch turns FP contraction off. On CUDA tensors the kernels are
compiled; on CPU tensors they run in Triton's interpreter when ``TRITON_INTERPRET=1`` is set
before this package is imported. ``replay.replay_tokens`` runs a whole response's decode steps
(conv then recurrent, token by token) per call with the same arithmetic, unvalidated (its
callers check). docs/kernels.md describes the design and its checks.
"""

from .conv import conv_update
from .recurrent import recurrent_step

__all__ = ["conv_update", "recurrent_step"]
