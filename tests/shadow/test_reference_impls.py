"""The golden reference by the golden-matched kernels gives the goldens' bits, and the checker
takes the kernels only where they can run and did not serve the rows.

The kernels run under Triton's interpreter here (tests/kernels/conftest.py's copy of the
package); on CUDA the compiled ones are pinned to the goldens by tests/gpu/.
"""

from __future__ import annotations

import importlib
from types import SimpleNamespace

import pytest
import torch

from tests.kernels.conftest import INTERPRETED_KERNELS, KERNELS_DIR, import_interpreted
from tests.shadow.pairs import snapshot_case
from vllm_gdn_invariant.shadow import checker as checker_module
from vllm_gdn_invariant.shadow import reference as reference_module
from vllm_gdn_invariant.shadow.bits import same_bits
from vllm_gdn_invariant.shadow.checker import Pending, ShadowChecker
from vllm_gdn_invariant.shadow.config import ShadowSettingError, parse_shadow
from vllm_gdn_invariant.shadow.metrics import ShadowMetrics
from vllm_gdn_invariant.shadow.reference import (
    GOLDEN_KERNELS,
    GOLDENS,
    StateLayout,
    golden_kernels_reference,
    golden_reference,
)

FIELDS = ("output", "recurrent_state", "conv_state")
CPU = torch.device("cpu")


@pytest.fixture
def interpreted_decode_step(monkeypatch):
    """reference.py's golden kernels, interpreted (CPU tensors)."""
    import_interpreted(INTERPRETED_KERNELS, KERNELS_DIR)
    serving = importlib.import_module(f"{INTERPRETED_KERNELS}.serving")
    monkeypatch.setattr(reference_module, "decode_step", serving.decode_step)


@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("dim_first", [True, False], ids=["dim-first", "width-first"])
def test_the_golden_kernels_give_the_goldens_bits(interpreted_decode_step, state_dtype, dim_first):
    snapshot, params = snapshot_case(state_dtype, dim_first, CPU)
    layout = StateLayout(conv_dim_first=dim_first)
    before = {name: t.clone() for name, t in vars(snapshot).items()}
    by_goldens = golden_reference(snapshot, params, layout, torch.bfloat16)
    by_kernels = golden_kernels_reference(snapshot, params, layout, torch.bfloat16)
    for name in FIELDS:
        want, got = getattr(by_goldens, name), getattr(by_kernels, name)
        assert got.dtype == want.dtype and got.shape == want.shape
        assert same_bits(got, want), name
    # the references work on copies: the snapshot is as it was taken
    assert all(same_bits(before[n], t) for n, t in vars(snapshot).items())
    # the step moved the state: a reference that returned its input would not pass above
    assert not same_bits(by_kernels.recurrent_state, snapshot.ssm_blocks)


def test_a_spent_snapshot_gives_the_same_bits_and_holds_the_new_blocks(interpreted_decode_step):
    snapshot, params = snapshot_case(torch.bfloat16, True, CPU)
    layout = StateLayout(conv_dim_first=True)
    on_copies = golden_kernels_reference(snapshot, params, layout, torch.bfloat16)
    spent = golden_kernels_reference(snapshot, params, layout, torch.bfloat16, spend=True)
    for name in FIELDS:
        assert same_bits(getattr(spent, name), getattr(on_copies, name)), name
    assert same_bits(snapshot.ssm_blocks, on_copies.recurrent_state)
    assert same_bits(snapshot.conv_blocks, on_copies.conv_state)


def test_only_the_last_reference_of_a_check_spends_the_snapshot(tmp_path, monkeypatch):
    spent = []

    def spy(reference):
        def compute(*args, spend=False, **kwargs):
            spent.append((reference, spend))
            raise RuntimeError("stop before the compare")

        return compute

    monkeypatch.setattr(checker_module, "golden_kernels_reference", spy("golden"))
    monkeypatch.setattr(checker_module, "decode_reference", spy("decode"))
    config = parse_shadow(f"1.0,ref=golden+decode,out={tmp_path}/s.jsonl")
    checker = ShadowChecker(config, "route", metrics=ShadowMetrics())
    snapshot, params = snapshot_case(torch.float32, True, CPU)
    where = SimpleNamespace(
        layer=None,
        attn_metadata=None,
        decode_call=None,
        golden_params=lambda: params,
        conv_cache=torch.zeros(1, 1),
        ssm_cache=SimpleNamespace(is_cuda=True),
        layout=StateLayout(conv_dim_first=True),
    )
    checker.finish(Pending(where, snapshot, 3, 1), torch.zeros(3, 1))
    checker.close()
    assert spent == [("golden", False), ("decode", True)]
    assert checker.stats.failures["reference"] == 2


def test_a_wrong_conv_layout_is_seen(interpreted_decode_step):
    snapshot, params = snapshot_case(torch.float32, True, CPU)
    by_goldens = golden_reference(
        snapshot, params, StateLayout(conv_dim_first=True), torch.bfloat16
    )
    wrong = golden_kernels_reference(
        snapshot, params, StateLayout(conv_dim_first=False), torch.bfloat16
    )
    assert not same_bits(wrong.output, by_goldens.output)


def test_the_golden_kernels_refuse_the_cpu_paths_transposed_state():
    snapshot, params = snapshot_case(torch.float32, True, CPU)
    layout = StateLayout(conv_dim_first=True, recurrent_k_major=True)
    with pytest.raises(ValueError, match=r"\[HV, V, K\] only"):
        golden_kernels_reference(snapshot, params, layout, torch.bfloat16)


def site(is_cuda: bool, k_major: bool = False) -> SimpleNamespace:
    return SimpleNamespace(
        ssm_cache=SimpleNamespace(is_cuda=is_cuda),
        layout=StateLayout(conv_dim_first=True, recurrent_k_major=k_major),
    )


@pytest.mark.parametrize(
    "setting, mode, where, want",
    [
        ("1.0", "route", site(True), GOLDEN_KERNELS),
        ("1.0", "off", site(True), GOLDEN_KERNELS),
        ("1.0", "golden", site(True), GOLDENS),  # the kernels served these rows
        ("1.0", "route", site(False), GOLDENS),
        ("1.0", "route", site(True, k_major=True), GOLDENS),
        ("1.0,golden_impl=torch", "route", site(True), GOLDENS),
    ],
    ids=["cuda-route", "cuda-off", "cuda-golden-mode", "cpu", "k-major", "torch-asked"],
)
def test_the_checker_takes_the_kernels_only_where_they_can_check(
    tmp_path, setting, mode, where, want
):
    config = parse_shadow(f"{setting},out={tmp_path}/s.jsonl")
    checker = ShadowChecker(config, mode, metrics=ShadowMetrics())
    assert checker.golden_impl(where) == want
    checker.close()


def test_golden_impl_is_validated(tmp_path):
    out = f"out={tmp_path}/s.jsonl"
    assert parse_shadow(f"1/64,golden_impl=torch,{out}").golden_impl == "torch"
    assert parse_shadow(f"1/64,{out}").golden_impl == "auto"
    with pytest.raises(ShadowSettingError, match="golden_impl='kernels' is not one of auto, torch"):
        parse_shadow(f"1/64,golden_impl=kernels,{out}")
    with pytest.raises(ShadowSettingError, match="needs ref=golden"):
        parse_shadow(f"1/64,ref=decode,golden_impl=torch,{out}")
