"""The what-if kernels that issue the recurrent step's loads earlier: the goldens' bits in Triton's
interpreter (inactive rows, a partial last block), and, compiled for sm_90 without a GPU,
gdn_evidence/harness/loads_ahead_kernel.py's kernels are ours with other bulk L2 prefetches (ours
asks one block ahead) or with every global load before the first barrier (ours' has not); all
keep the goldens' no-FMA rule and ours' registers or fewer."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest
import torch

from gdn_evidence.harness.launch_shapes import qwen3_next_dims
from gdn_evidence.harness.loads_ahead_kernel import l2_prefetch_kernel, loads_ahead_kernel
from gdn_evidence.harness.what_if_arguments import what_if_constexprs
from vllm_gdn_invariant.kernels import codegen
from vllm_gdn_invariant.kernels import recurrent as recurrent_kernel

from .helpers import run_interpreted

pytestmark = pytest.mark.skipif(
    recurrent_kernel.INTERPRETED, reason="compiles for sm_90: not under TRITON_INTERPRET=1"
)

# kernel, its extra compile-time arguments (every one: the compile here passes no defaults), the
# prefetches in its code: one before ours (the program's whole range), or one before the loop and
# one at the top of each iteration
KERNELS = {
    # ours as the what-if kernels store their outputs (tl.store: OUT_AS_HELD off)
    "ours": (recurrent_kernel.recurrent_step_kernel, {"OUT_AS_HELD": False}, 2),
    "l2_prefetch": (l2_prefetch_kernel, {}, 1),
    "without_l2_ahead": (loads_ahead_kernel, {"AHEAD": 0, "EARLY_LOADS": False}, 0),
    "l2_ahead_2": (loads_ahead_kernel, {"AHEAD": 2, "EARLY_LOADS": False}, 2),
    "early_l2_ahead_2": (loads_ahead_kernel, {"AHEAD": 2, "EARLY_LOADS": True}, 2),
    "early_loads": (loads_ahead_kernel, {"AHEAD": 0, "EARLY_LOADS": True}, 0),
}


def as_module(kernel, constexprs: dict) -> SimpleNamespace:
    """``kernel``, with ``constexprs`` beside ours' arguments, where ``codegen.compile_recurrent``
    looks for ours."""

    def kernel_arguments(*arguments):
        grid, positional, ours = recurrent_kernel.kernel_arguments(*arguments)
        if kernel is not recurrent_kernel.recurrent_step_kernel:
            ours = what_if_constexprs(ours)
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
@pytest.mark.parametrize("name", ["ours", "early_loads"])
def test_early_loads_issue_every_load_before_the_first_barrier(name, state_dtype):
    kernel, constexprs, _ = KERNELS[name]
    dims = qwen3_next_dims(1)
    config = recurrent_kernel.recurrent_config(dims, state_dtype, interpreted=False)
    assert config.chunks == 1  # one block per program: no load of a next block
    compiled = codegen.compile_recurrent(
        dims, state_dtype=state_dtype, module=as_module(kernel, constexprs)
    )
    ours = codegen.compile_recurrent(
        dims, state_dtype=state_dtype, module=as_module(*KERNELS["ours"][:2])
    )
    opcodes = SASS_OPCODE.findall(codegen.sass_of(compiled.asm["cubin"]))
    first_barrier = opcodes.index("BAR")
    loads_after = [i for i, op in enumerate(opcodes) if op == "LDG" and i > first_barrier]
    assert bool(loads_after) is (name == "ours")
    assert codegen.report_of(compiled).clean
    usage = codegen.resource_usage(compiled)
    assert not usage.spills and usage.registers <= codegen.resource_usage(ours).registers


# Each kernel against the golden in Triton's interpreter (where the prefetches are skipped), on
# tests/harness/interpreted_recurrent.py's case (inactive rows 1 and 3): V = 24 in blocks of 8
# rows, 4 per program (the last block past V) or 1, or V = 32, whole blocks.
GOLDEN_BITS = """
import json, torch
from gdn_evidence.harness.loads_ahead_kernel import l2_prefetch_kernel, loads_ahead_kernel
from gdn_evidence.harness.what_if_arguments import what_if_constexprs
from tests.harness.interpreted_recurrent import bit_differences, recurrent_case

CASES = {  # name: kernel, V, blocks per program, compile-time arguments
    "early_loads chunks=4": (loads_ahead_kernel, 24, 4, {"AHEAD": 0, "EARLY_LOADS": True}),
    "early_loads chunks=1": (loads_ahead_kernel, 24, 1, {"AHEAD": 0, "EARLY_LOADS": True}),
    "l2_prefetch": (l2_prefetch_kernel, 32, 4, {}),
    "without_l2_ahead": (loads_ahead_kernel, 32, 4, {"AHEAD": 0, "EARLY_LOADS": False}),
    "l2_ahead_2 chunks=4": (loads_ahead_kernel, 24, 4, {"AHEAD": 2, "EARLY_LOADS": False}),
    "early_l2_ahead_2": (loads_ahead_kernel, 32, 4, {"AHEAD": 2, "EARLY_LOADS": True}),
}
g = torch.Generator().manual_seed(0)
results = {}
for name, (kernel, V, chunks, extra) in CASES.items():
    for dtype in (torch.float32, torch.bfloat16):
        def launch(grid, arguments, constexprs, kernel=kernel, extra=extra):
            kernel[grid](*arguments, **what_if_constexprs(constexprs), **extra, num_warps=1)
        case = recurrent_case(g, dtype, V)
        results[f"{name} {str(dtype)[6:]}"] = bit_differences(case, chunks, launch)
print(json.dumps(results))
"""


def test_the_kernels_write_the_goldens_bits_in_the_interpreter():
    cases = run_interpreted(GOLDEN_BITS)
    assert len(cases) == 12
    for name, case in cases.items():
        assert case["out_bits_differ"] == 0, name
        assert case["state_bits_differ"] == 0, name
        assert case["state_changed"] > 0, name  # the step did update the state
