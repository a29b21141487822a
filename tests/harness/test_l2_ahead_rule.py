"""``loads_ahead_kernel.l2_ahead``, where a request into L2 ahead of the recurrent kernel's
loads can be issued (344febd's package rule): a program of two or more blocks, sm_90 or later,
compiled, the state's rows contiguous and 16-byte aligned; checked on layouts that break each
condition and on the package's default launch shapes."""

import pytest
import torch

from gdn_evidence.harness.loads_ahead_kernel import device_capability, l2_ahead
from vllm_gdn_invariant.kernels.recurrent import RecurrentConfig, recurrent_config
from vllm_gdn_invariant.kernels.validation import RecurrentDims

H, HV, K, V = 16, 32, 128, 128
CHUNKED = RecurrentConfig(block_v=16, log2_j=0, log2_cl=3, log2_vec=3, num_warps=2, chunks=8)
ONE_BLOCK = RecurrentConfig(block_v=8, log2_j=0, log2_cl=2, log2_vec=3, num_warps=1, chunks=1)


def dims(batch: int) -> RecurrentDims:
    return RecurrentDims(batch, H, HV, K, V, K**-0.5, True)


def state(dtype: torch.dtype = torch.bfloat16, *, pad_k: int = 0, blocks: int = 4) -> torch.Tensor:
    """A state [blocks, HV, V, K], rows of K + pad_k elements (the pad unused)."""
    return torch.zeros(blocks, HV, V, K + pad_k, dtype=dtype)[..., :K]


def test_the_prefetch_is_on_for_a_program_of_several_blocks_on_sm90():
    assert l2_ahead(state(), CHUNKED, 90, interpreted=False)
    assert l2_ahead(state(), CHUNKED, 100, interpreted=False)  # Blackwell
    assert l2_ahead(state(torch.float32), CHUNKED, 90, interpreted=False)


@pytest.mark.parametrize(
    "why, config, capability, interpreted",
    [
        ("one block per program", ONE_BLOCK, 90, False),
        ("no bulk prefetch before sm_90", CHUNKED, 80, False),
        ("interpreted", CHUNKED, 90, True),
    ],
)
def test_the_prefetch_is_off(why, config, capability, interpreted):
    assert not l2_ahead(state(), config, capability, interpreted=interpreted), why


@pytest.mark.parametrize(
    "why, layout",
    [
        ("base 8 bytes off", lambda: torch.zeros(4 * HV * V * K + 4, dtype=torch.bfloat16)[4:]
         .view(4, HV, V, K)),
        ("rows 8 bytes longer than K", lambda: state(pad_k=4)),
        ("rows not contiguous",
         lambda: torch.zeros(4, HV, V, 2 * K, dtype=torch.bfloat16)[..., ::2]),
        ("blocks 8 bytes apart past a whole number of heads",
         lambda: torch.zeros(4, HV * V * K + 4, dtype=torch.bfloat16)[:, :HV * V * K]
         .view(4, HV, V, K)),
    ],
)  # fmt: skip
def test_the_prefetch_is_off_for_a_misaligned_state(why, layout):
    misaligned = layout()
    assert misaligned.shape == (4, HV, V, K), why
    assert not l2_ahead(misaligned, CHUNKED, 90, interpreted=False), why


def test_the_rule_follows_the_default_launch_shapes():
    """bf16 from B = 16 (programs of several blocks) at 32 value heads; fp32 never."""
    for batch, dtype, expected in [
        (1, torch.bfloat16, False),
        (8, torch.bfloat16, False),
        (16, torch.bfloat16, True),
        (1024, torch.bfloat16, True),
        (1024, torch.float32, False),
    ]:
        config = recurrent_config(dims(batch), dtype, interpreted=False)
        assert l2_ahead(state(dtype), config, 90, interpreted=False) is expected, (batch, dtype)


def test_a_rocm_or_cpu_device_has_no_capability_for_the_rule(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 4))
    monkeypatch.setattr(torch.version, "hip", None)
    assert device_capability(torch.device("cuda", 0)) == 94  # an NVIDIA build
    assert device_capability(torch.device("cpu")) == 0
    monkeypatch.setattr(torch.version, "hip", "6.2.41133")
    assert device_capability(torch.device("cuda", 0)) == 0  # ROCm's torch: type cuda, no sm_90
