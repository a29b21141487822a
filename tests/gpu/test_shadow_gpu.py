"""GPU: the shadow checker around vLLM's real ``_forward_core`` and Triton kernels.

* reference ``decode`` (vLLM's decode-only kernels on a copy) finds nothing where the rows
  took the decode-only path (decode-only steps, routed mixed steps) and finds vLLM's mixed
  path's differences with the routing off;
* reference ``golden`` finds the known distance of vLLM's packed-decode kernel from the goldens
  (docs/goldens.md: the fp32 recurrent state differs, the conv state is bitwise equal) and
  nothing under mode golden's patches;
* with the checker on, every served bit is the same as with it off.

Skipped without CUDA; each arm applies its patches and reverts them.
"""

from __future__ import annotations

import pytest
import torch

from gdn_evidence.harness.layer import QWEN3_NEXT_TP4_DIMS, make_vllm_config
from gdn_evidence.harness.mixed_step import COMPOSITIONS, Composition
from gdn_evidence.harness.shadow_case import FIELDS, installed, shadow_case

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

CUDA = torch.device("cuda")
DIMS = QWEN3_NEXT_TP4_DIMS  # the goldens on a GPU are slow; the routing evidence runs tp1
CASES = [Composition(4, (), False), *COMPOSITIONS[:3]]
ARMS = {  # arm: (routing patch, mode golden's patches, mode)
    "routed": (True, False, "route"),
    "routing off": (False, False, "off"),
    "mode golden": (True, True, "golden"),
}


def zero(record) -> bool:
    return all(record[name]["differing"] == 0 for name in FIELDS)


@pytest.mark.parametrize("arm", list(ARMS))
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_references_find_what_served_the_decode_rows(arm, state_dtype):
    routed, golden_mode, mode = ARMS[arm]
    vllm_config = make_vllm_config(DIMS, state_dtype)
    with installed(routed, golden_mode):
        for seed, composition in enumerate(CASES):
            case = shadow_case(
                vllm_config, DIMS, state_dtype, composition, device=CUDA, mode=mode, seed=seed
            )
            assert case["served_bits_unchanged"] and not case["failures"], composition
            golden, decode = case["records"]
            mixed = bool(composition.prefills) and golden["step_kind"] == "mixed"
            if golden_mode:
                assert golden["provider"] == "golden-kernels"
                assert zero(golden), composition
                continue
            if mixed and not routed:
                assert golden["provider"] == "vllm-mixed"
                if state_dtype == torch.float32:
                    assert decode["recurrent_state"]["differing"] > 0, composition
                continue
            assert golden["provider"] == ("routed" if mixed else "vllm-packed-decode")
            assert zero(decode), composition
            assert golden["conv_state"]["differing"] == 0, composition
            if state_dtype == torch.float32:
                assert golden["recurrent_state"]["differing"] > 0, composition
