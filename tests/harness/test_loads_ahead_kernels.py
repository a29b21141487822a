"""The what-if kernels that issue the recurrent step's loads earlier, compiled for sm_90 without a
GPU: gdn_evidence/harness/l2_prefetch_kernel.py's kernels are ours with bulk L2 prefetches (ours
has none), early_loads_kernel issues every global load before its first barrier (ours does not);
all keep the goldens' no-FMA rule and ours' registers or fewer."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest
import torch

from gdn_evidence.harness.early_loads_kernel import early_loads_kernel
from gdn_evidence.harness.l2_prefetch_kernel import l2_ahead_kernel, l2_prefetch_kernel
from gdn_evidence.harness.launch_shapes import qwen3_next_dims
from vllm_gdn_invariant.kernels import codegen
from vllm_gdn_invariant.kernels import recurrent as recurrent_kernel

pytestmark = pytest.mark.skipif(
    recurrent_kernel.INTERPRETED, reason="compiles for sm_90: not under TRITON_INTERPRET=1"
)

# kernel, its extra compile-time arguments, the prefetches in its code: one before ours (the
# program's whole range), or one before the loop and one at the top of each iteration
KERNELS = {
    "ours": (recurrent_kernel.recurrent_step_kernel, {}, 0),
    "l2_prefetch": (l2_prefetch_kernel, {}, 1),
    "l2_ahead_1": (l2_ahead_kernel, {"AHEAD": 1}, 2),
    "l2_ahead_2": (l2_ahead_kernel, {"AHEAD": 2}, 2),
}


def as_module(kernel, constexprs: dict) -> SimpleNamespace:
    """``kernel``, with ``constexprs`` beside ours' arguments, where ``codegen.compile_recurrent``
    looks for ours."""

    def kernel_arguments(*arguments):
        grid, positional, ours = recurrent_kernel.kernel_arguments(*arguments)
        return grid, positional, ours | constexprs

    return SimpleNamespace(
        recurrent_step_kernel=kernel,
        kernel_arguments=kernel_arguments,
        recurrent_config=recurrent_kernel.recurrent_config,
    )


def compiled_at_the_default_bf16_shape(name: str):
    kernel, constexprs, _ = KERNELS[name]
    dims = qwen3_next_dims(128)
    config = recurrent_kernel.recurrent_config(dims, torch.bfloat16, interpreted=False)
    assert config.chunks > 1  # the default bf16 shape takes blocks in turn
    return codegen.compile_recurrent(
        dims, state_dtype=torch.bfloat16, module=as_module(kernel, constexprs)
    )


@pytest.fixture(scope="module")
def ours_registers() -> int:
    return codegen.resource_usage(compiled_at_the_default_bf16_shape("ours")).registers


@pytest.mark.parametrize("name", KERNELS)
def test_the_l2_prefetch_kernels_are_ours_with_bulk_prefetches(name, ours_registers):
    compiled = compiled_at_the_default_bf16_shape(name)
    ptx, sass = compiled.asm["ptx"], codegen.sass_of(compiled.asm["cubin"])
    prefetches = KERNELS[name][2]
    assert ptx.count("cp.async.bulk.prefetch.L2.global") == prefetches
    assert sass.count("UBLKPF.L2") == prefetches
    assert codegen.report_of(compiled).clean
    usage = codegen.resource_usage(compiled)
    assert not usage.spills and usage.registers == ours_registers


SASS_OPCODE = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T0-9]\s+)?([A-Z0-9_]+)")


@pytest.mark.parametrize("state_dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("kernel", [recurrent_kernel.recurrent_step_kernel, early_loads_kernel])
def test_early_loads_issue_every_load_before_the_first_barrier(kernel, state_dtype):
    dims = qwen3_next_dims(1)
    config = recurrent_kernel.recurrent_config(dims, state_dtype, interpreted=False)
    assert config.chunks == 1  # one block per program: no load of a next block
    compiled = codegen.compile_recurrent(
        dims, state_dtype=state_dtype, module=as_module(kernel, {})
    )
    ours = codegen.compile_recurrent(dims, state_dtype=state_dtype)
    opcodes = SASS_OPCODE.findall(codegen.sass_of(compiled.asm["cubin"]))
    first_barrier = opcodes.index("BAR")
    loads_after = [i for i, op in enumerate(opcodes) if op == "LDG" and i > first_barrier]
    assert bool(loads_after) is (kernel is recurrent_kernel.recurrent_step_kernel)
    assert codegen.report_of(compiled).clean
    usage = codegen.resource_usage(compiled)
    assert not usage.spills and usage.registers <= codegen.resource_usage(ours).registers
