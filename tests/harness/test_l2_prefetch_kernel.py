"""gdn_evidence/harness/l2_prefetch_kernel.py compiled for sm_90 without a GPU: one bulk L2
prefetch ahead of ours' code, which has none, and the goldens' no-FMA rule kept."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from gdn_evidence.harness.l2_prefetch_kernel import l2_prefetch_kernel
from gdn_evidence.harness.launch_shapes import qwen3_next_dims
from vllm_gdn_invariant.kernels import codegen
from vllm_gdn_invariant.kernels import recurrent as recurrent_kernel

pytestmark = pytest.mark.skipif(
    recurrent_kernel.INTERPRETED, reason="compiles for sm_90: not under TRITON_INTERPRET=1"
)

PREFETCHING = SimpleNamespace(
    recurrent_step_kernel=l2_prefetch_kernel,
    kernel_arguments=recurrent_kernel.kernel_arguments,
    recurrent_config=recurrent_kernel.recurrent_config,
)


@pytest.mark.parametrize("module", [recurrent_kernel, PREFETCHING], ids=["ours", "l2_prefetch"])
def test_the_l2_prefetch_kernel_is_ours_with_one_bulk_prefetch(module):
    dims = qwen3_next_dims(128)
    config = recurrent_kernel.recurrent_config(dims, torch.bfloat16, interpreted=False)
    assert config.chunks > 1  # the default bf16 shape takes blocks in turn
    compiled = codegen.compile_recurrent(dims, state_dtype=torch.bfloat16, module=module)
    ptx, sass = compiled.asm["ptx"], codegen.sass_of(compiled.asm["cubin"])
    expected = 1 if module is PREFETCHING else 0
    assert ptx.count("cp.async.bulk.prefetch.L2.global") == expected
    assert sass.count("UBLKPF.L2") == expected
    assert codegen.report_of(compiled).clean
    assert not codegen.resource_usage(compiled).spills
