"""vLLM 0.33+ picks the packed-decode value tile ``BV`` on Blackwell from ``B * HV``; under
batch-invariant mode the plugin pins it. The rule, and vLLM's own launcher on a platform that
answers as Blackwell (or Hopper) with the Triton kernel replaced by a recorder. The H200 of
the GPU evidence is SM90 and cannot run the Blackwell branch."""

from __future__ import annotations

import pytest
import torch
from packaging.version import Version

from vllm_gdn_invariant.patches import applied
from vllm_gdn_invariant.patches.bi_packed_decode import (
    PACKED_DECODE_TILE_SINCE,
    packed_decode_patch,
    pinned_tile,
)
from vllm_gdn_invariant.plugin.versions import installed_release

H, HV, K, V = 2, 4, 128, 128
BATCHES = [1, 16, 17, 64]  # B * HV: 4, 64 (small tile in vLLM), 68, 256 (large tile)


@pytest.mark.parametrize(
    "bv, k, v, fp32, blackwell, expected",
    [
        (4, 128, 128, True, True, 8),  # vLLM's small-batch tile -> the large-batch one
        (8, 128, 128, True, True, 8),
        (4, 128, 128, False, True, 32),
        (32, 128, 128, False, True, 32),
        (4, 128, 128, True, False, 4),  # Hopper: vLLM's choice, batch-independent, kept
        (32, 64, 64, True, True, 32),  # other head sizes: vLLM's default, kept
    ],
)
def test_pinned_tile_rule(bv, k, v, fp32, blackwell, expected):
    assert pinned_tile(bv, k, v, fp32, blackwell) == expected


class Platform:
    """``current_platform`` of vLLM's fused_recurrent module, as Blackwell or Hopper answers."""

    def __init__(self, family: int) -> None:
        self.family = family

    def is_cuda(self) -> bool:
        return True

    def is_device_capability_family(self, family, device_id=None) -> bool:
        return family == self.family

    def is_device_capability(self, capability, device_id=None) -> bool:
        return capability == self.family


class Recorder:
    def __init__(self) -> None:
        self.launches: list[dict] = []

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.launches.append({"grid": tuple(grid), "BV": kwargs["BV"]})

        return launch


def decode(fused_recurrent, batch: int, state_dtype=torch.float32) -> None:
    """One call of vLLM's packed decode on CPU tensors of the right shapes."""
    fused_recurrent.fused_recurrent_gated_delta_rule_packed_decode(
        mixed_qkv=torch.zeros(batch, 2 * H * K + HV * V, dtype=torch.bfloat16),
        a=torch.zeros(batch, HV, dtype=torch.bfloat16),
        b=torch.zeros(batch, HV, dtype=torch.bfloat16),
        A_log=torch.zeros(HV),
        dt_bias=torch.zeros(HV),
        scale=K**-0.5,
        initial_state=torch.zeros(batch + 1, HV, V, K, dtype=state_dtype),
        out=torch.empty(batch, 1, HV, V, dtype=torch.bfloat16),
        ssm_state_indices=torch.arange(1, batch + 1, dtype=torch.int32),
        use_qk_l2norm_in_kernel=True,
    )


release = installed_release()
if release is not None and Version(release) >= Version(PACKED_DECODE_TILE_SINCE):
    from vllm.third_party.flash_linear_attention.ops import fused_recurrent

    @pytest.fixture
    def triton_helpers(monkeypatch):
        if not hasattr(fused_recurrent.triton, "next_power_of_2"):
            import triton

            monkeypatch.setattr(fused_recurrent, "triton", triton)

    def launches(monkeypatch, family: int, patched: bool, state_dtype=torch.float32):
        monkeypatch.setattr(fused_recurrent, "current_platform", Platform(family))
        recorder = Recorder()
        if patched:
            patch = packed_decode_patch()
            with applied([patch]):
                fused_recurrent.fused_recurrent_gated_delta_rule_packed_decode_kernel.kernel = (
                    recorder
                )
                for batch in BATCHES:
                    decode(fused_recurrent, batch, state_dtype)
        else:
            name = "fused_recurrent_gated_delta_rule_packed_decode_kernel"
            with pytest.MonkeyPatch.context() as kernel:
                kernel.setattr(fused_recurrent, name, recorder)
                for batch in BATCHES:
                    decode(fused_recurrent, batch, state_dtype)
        return recorder.launches

    def test_vllm_alone_picks_the_blackwell_tile_from_the_batch(monkeypatch, triton_helpers):
        tiles = [launch["BV"] for launch in launches(monkeypatch, 100, patched=False)]
        assert tiles == [4, 4, 8, 8]  # negative control

    @pytest.mark.parametrize("state_dtype, tile", [(torch.float32, 8), (torch.bfloat16, 32)])
    def test_the_blackwell_tile_is_pinned_with_the_plugin(
        monkeypatch, triton_helpers, state_dtype, tile
    ):
        recorded = launches(monkeypatch, 100, patched=True, state_dtype=state_dtype)
        assert [launch["BV"] for launch in recorded] == [tile] * len(BATCHES)
        assert {launch["grid"][0] for launch in recorded} == {V // tile}
        assert [launch["grid"][1] for launch in recorded] == [b * HV for b in BATCHES]

    def test_hopper_keeps_vllms_tile(monkeypatch, triton_helpers):
        alone = launches(monkeypatch, 90, patched=False)
        assert launches(monkeypatch, 90, patched=True) == alone
