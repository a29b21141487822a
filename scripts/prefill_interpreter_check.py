"""vLLM's FLA chunk prefill in Triton's interpreter (CPU): a sequence alone vs in a varlen batch.

    python scripts/prefill_interpreter_check.py

The interpreter runs the kernels' own indexing, masking and chunk bookkeeping with NumPy
arithmetic, one program after another. A difference here would be a logic fault (a read
outside the sequence, an unwritten buffer); none means that a difference on the GPU comes
from the compiled arithmetic. Runs on vLLM's CPU build, whose ``vllm.triton_utils`` hides
Triton when no GPU driver is active; to run the kernels anyway this script, in its own
process only: hands the real ``triton`` to ``vllm.triton_utils``, gives the autotuner a
constant timing (the first config of each kernel is used, as a fixed config would be), and
replaces the FLA modules' ``exp``/``exp2``/``log`` aliases and ``range`` with forms the
interpreter accepts. Small dims (2 heads of 32) keep it to minutes.
"""

from __future__ import annotations

import builtins
import os
import sys

os.environ["TRITON_INTERPRET"] = "1"

import checkout  # noqa: F401 - this checkout first on sys.path
import torch
import triton
import triton.language as tl
import triton.language.extra.libdevice as tldevice
import triton.runtime.autotuner as autotuner
import vllm.triton_utils as triton_utils

from gdn_evidence.harness.chunk_prefill import cu_seqlens, varlen_inputs
from vllm_gdn_invariant.shadow.bits import differ

HV, K, V = 2, 32, 32
PLACEMENTS = {"after_317": [300, 17], "after_320": [320], "first": []}
TARGET, AFTER = 200, [130, 5]


def interpreter_range(*bounds):
    values = [int(b.handle.data.item()) if hasattr(b, "handle") else int(b) for b in bounds]
    for i in builtins.range(*values):
        yield tl.full((), i, tl.int32)


def load_fla():
    triton_utils.triton, triton_utils.tl, triton_utils.tldevice = triton, tl, tldevice
    autotuner.Autotuner._bench = lambda self, *args, config=None, **kwargs: [1.0, 1.0, 1.0]
    import vllm.third_party.flash_linear_attention.ops as ops

    loaded = [m for n, m in sys.modules.items() if n.startswith(ops.__name__ + ".")]
    for module in loaded:
        module.range = interpreter_range
        for name, fn in (("exp", tl.exp), ("exp2", tl.exp2), ("log", tl.log)):
            if hasattr(module, name):
                setattr(module, name, lambda x, fn=fn.__name__: getattr(tl, fn)(x))
    return ops.chunk_gated_delta_rule


def main() -> int:
    chunk_gated_delta_rule = load_fla()

    def prefill(q, k, v, decay, beta, lengths):
        cu = cu_seqlens(lengths, "cpu")
        initial = torch.zeros(len(lengths), HV, V, K)
        return chunk_gated_delta_rule(
            q=q, k=k, v=v, g=decay, beta=beta, initial_state=initial,
            output_final_state=True, cu_seqlens=cu, use_qk_l2norm_in_kernel=True,
        )  # fmt: skip

    differing = 0
    for placement, before in PLACEMENTS.items():
        lengths = [*before, TARGET, *AFTER]
        start = sum(before)
        batch = varlen_inputs(sum(lengths), 1, HV, K, V, "cpu")
        out, final = prefill(*batch, lengths)
        alone_out, alone_final = prefill(
            *[t[:, start : start + TARGET].clone() for t in batch], [TARGET]
        )
        d_out = differ(out[:, start : start + TARGET], alone_out)
        d_final = differ(final[len(before)], alone_final[0])
        differing += d_out + d_final
        print(
            f"{placement}: output {d_out} of {alone_out.numel()} differing, "
            f"final state {d_final} of {alone_final.numel()}",
            flush=True,
        )
    return 1 if differing else 0


if __name__ == "__main__":
    raise SystemExit(main())
