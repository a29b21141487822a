"""The shadow checker around vLLM's real ``_forward_core`` on CPU (stand-in kernels).

The stand-ins make the served bits known: a decode-only step's rows are the goldens' bits,
and so are a routed mixed step's; vLLM's own mixed path rounds the recurrent state
differently. So a right checker reports 0 differences exactly where the rows were served by
the goldens' arithmetic and differences where they were not, and never changes a served bit.
"""

from __future__ import annotations

import threading
from types import SimpleNamespace
from unittest import mock

import pytest
import torch
from vllm.model_executor.layers.mamba.gdn import qwen_gdn_linear_attn as qwen

from vllm_gdn_invariant.patches import applied, apply_all, routed_forward_core, routing_patch
from vllm_gdn_invariant.patches.base import PatchError
from vllm_gdn_invariant.patches.shadow import shadow_patches
from vllm_gdn_invariant.shadow import checker as checker_module
from vllm_gdn_invariant.shadow import metrics
from vllm_gdn_invariant.shadow.bits import same_bits

from ..routing import standins
from .helpers import Step, make_checker, records

FIELDS = ("output", "recurrent_state", "conv_state")


@pytest.fixture(autouse=True)
def standins_and_no_registry(standin_kernels, monkeypatch):
    monkeypatch.setattr(metrics, "setup_process", lambda: None)  # no REGISTRY side effects


@pytest.fixture(params=["routed", "vllm"])
def patched(request, monkeypatch):
    """The shadow wrappers, over the routing patch ("routed") or over vLLM's own method."""
    monkeypatch.setattr(metrics, "setup_process", lambda: None)
    patches = ([routing_patch()] if request.param == "routed" else []) + shadow_patches()
    with applied(patches):
        yield request.param


def differing(record):
    return {name: record[name]["differing"] for name in FIELDS}


@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("decodes, prefills", [(4, []), (3, [9, 17]), (1, [40])])
def test_served_bits_are_the_same_with_the_checker_on_and_off(
    patched, tmp_path, state_dtype, decodes, prefills
):
    step = Step.make(decodes, prefills, state_dtype, seed=decodes)
    checker_module.install(None)
    with mock.patch.object(checker_module, "active_checker", return_value=None):
        off_out, off_state = step.run()
    make_checker(tmp_path, "1.0,ref=golden+decode")
    on_out, on_state = step.run()
    assert len(records(checker_module.active_checker())) == 2
    assert same_bits(on_out, off_out)
    assert same_bits(on_state.ssm_state, off_state.ssm_state)
    assert same_bits(on_state.conv_state, off_state.conv_state)


def test_rows_served_with_the_goldens_arithmetic_show_no_difference(patched, tmp_path):
    checker = make_checker(tmp_path, "1.0,ref=golden+decode")
    Step.make(4, [], torch.float32).run()
    Step.make(3, [9, 17], torch.float32, seed=1).run()
    got = records(checker)
    assert [(r["step_kind"], r["reference"]) for r in got] == [
        ("decode", "golden"),
        ("decode", "decode"),
        ("mixed", "golden"),
        ("mixed", "decode"),
    ]
    decode_only, mixed = got[0], got[2]
    assert decode_only["provider"] == "vllm-packed-decode"
    assert differing(decode_only) == dict.fromkeys(FIELDS, 0)
    assert (decode_only["rows"], decode_only["decode_rows"]) == (4, 4)
    assert decode_only["output"]["compared"] == 4 * 4 * 32
    assert decode_only["recurrent_state"]["compared"] == 4 * 4 * 32 * 32
    if patched == "routed":
        assert mixed["provider"] == "routed"
        assert all(differing(r) == dict.fromkeys(FIELDS, 0) for r in got[2:])
    else:
        # vLLM's mixed path rounds the decode rows' state differently: both references see it
        assert mixed["provider"] == "vllm-mixed"
        for record in got[2:]:
            assert record["recurrent_state"]["differing"] > 0
            assert record["conv_state"]["differing"] == 0
    assert checker.stats.failures == {}


@pytest.mark.parametrize("field, corrupt", [("output", "out"), ("conv_state", "conv")])
def test_a_wrong_serving_kernel_is_caught_in_its_field_only(
    patched, tmp_path, monkeypatch, field, corrupt
):
    """Negative control: one element changed by the served kernels shows as one difference."""
    real_conv, real_recurrent = (
        standins.causal_conv1d_update,
        (standins.fused_recurrent_gated_delta_rule_packed_decode),
    )

    def conv(x, conv_state, *args, conv_state_indices=None, **kwargs):
        out = real_conv(x, conv_state, *args, conv_state_indices=conv_state_indices, **kwargs)
        if corrupt == "conv":
            block = int(conv_state_indices[0])
            conv_state[block, 0, 0] = conv_state[block, 0, 0] + 1
        return out

    def recurrent(*args, out=None, **kwargs):
        result = real_recurrent(*args, out=out, **kwargs)
        if corrupt == "out":
            out[1, 0, 0, 0] = -out[1, 0, 0, 0] - 1
        return result

    monkeypatch.setattr(qwen, "causal_conv1d_update", conv)
    monkeypatch.setattr(qwen, "fused_recurrent_gated_delta_rule_packed_decode", recurrent)
    checker = make_checker(tmp_path, "1.0")
    Step.make(4, [], torch.float32).run()
    (record,) = records(checker)
    assert differing(record) == {name: int(name == field) for name in FIELDS}


def test_row_cap_and_memory_cap_bound_the_snapshot(patched, tmp_path):
    step = Step.make(6, [], torch.float32)
    snapshot_bytes = {}
    for max_rows in (1, 2):
        (tmp_path / f"rows{max_rows}").mkdir()
        checker = make_checker(tmp_path / f"rows{max_rows}", f"1.0,max_rows={max_rows}")
        step.run()
        (record,) = records(checker)
        assert record["rows"] == max_rows
        snapshot_bytes[max_rows] = record["snapshot_bytes"]
    per_row = snapshot_bytes[2] - snapshot_bytes[1]
    fixed = snapshot_bytes[1] - per_row  # the scratch caches' null blocks
    assert fixed > 0

    cap_mb = (fixed + 3.5 * per_row) / 2**20  # room for 3 rows, not 4
    (tmp_path / "capped").mkdir()
    checker = make_checker(tmp_path / "capped", f"1.0,max_snapshot_mb={cap_mb!r}")
    step.run()
    (record,) = records(checker)
    assert record["rows"] == 3
    assert record["snapshot_bytes"] == fixed + 3 * per_row <= cap_mb * 2**20
    assert checker.stats.max_snapshot_bytes == fixed + 3 * per_row


def test_a_row_larger_than_the_memory_cap_is_not_checked(patched, tmp_path):
    checker = make_checker(tmp_path, "1.0,max_snapshot_mb=0.001")
    off = Step.make(2, [], torch.float32)
    out, state = off.run()
    assert records(checker) == [] and checker.stats.skipped_memory == 1
    checker_module.install(None)
    with mock.patch.object(checker_module, "active_checker", return_value=None):
        want_out, _ = off.run()
    assert same_bits(out, want_out)


@pytest.mark.parametrize(
    "stage, target",
    [("reference", "golden_reference"), ("compare", "start"), ("snapshot", "take_snapshot")],
)
def test_a_failure_in_the_shadow_path_is_counted_logged_once_and_the_step_goes_on(
    patched, tmp_path, monkeypatch, stage, target
):
    step = Step.make(3, [5], torch.float32)
    checker_module.install(None)
    with mock.patch.object(checker_module, "active_checker", return_value=None):
        want_out, want_state = step.run()

    def broken(*args, **kwargs):
        raise RuntimeError("injected")

    monkeypatch.setattr(checker_module, target, broken)
    checker = make_checker(tmp_path, "1.0")
    with mock.patch.object(checker_module, "logger") as logger:
        outs = [step.run() for _ in range(3)]
    for out, state in outs:
        assert same_bits(out, want_out) and same_bits(state.ssm_state, want_state.ssm_state)
    assert checker.stats.failures == {stage: 3} and checker.stats.checks == 0
    assert logger.warning.call_count == 1
    assert "injected" in logger.warning.call_args.args[1]
    failures = [r for r in records(checker) if r["kind"] == "failure"]
    assert [(r["stage"], r["error"]) for r in failures] == [(stage, "RuntimeError: injected")] * 3
    assert checker.metrics.failures.labels(stage)._value.get() == 3


def test_a_failure_in_submit_is_counted_logged_once_and_the_step_goes_on(
    patched, tmp_path, monkeypatch
):
    """The statistics travel as on CUDA (an event stand-in that has arrived), so each check is
    submitted; starting the checker's thread fails there, as in a process out of threads."""
    step = Step.make(3, [5], torch.float32)
    checker_module.install(None)
    with mock.patch.object(checker_module, "active_checker", return_value=None):
        want_out, want_state = step.run()
    start = checker_module.start

    def on_their_way(pairs, valid=None):
        pending = start(pairs, valid)
        pending.event = SimpleNamespace(query=lambda: True, synchronize=lambda: None)
        return pending

    thread_start = threading.Thread.start

    def out_of_threads(thread):
        if thread.name == "gdn-invariant-shadow":
            raise RuntimeError("can't start new thread")
        return thread_start(thread)

    monkeypatch.setattr(checker_module, "start", on_their_way)
    monkeypatch.setattr(threading.Thread, "start", out_of_threads)
    checker = make_checker(tmp_path, "1.0")
    with mock.patch.object(checker_module, "logger") as logger:
        outs = [step.run() for _ in range(3)]
    for out, state in outs:
        assert same_bits(out, want_out) and same_bits(state.ssm_state, want_state.ssm_state)
        assert same_bits(state.conv_state, want_state.conv_state)
    assert checker.stats.failures == {"submit": 3} and checker.stats.checks == 0
    assert logger.warning.call_count == 1
    assert "can't start new thread" in logger.warning.call_args.args[1]
    assert checker.metrics.failures.labels("submit")._value.get() == 3
    monkeypatch.setattr(threading.Thread, "start", thread_start)
    step.run()  # the thread starts now: the check is submitted and finished
    assert checker.close(timeout=10) and checker.stats.checks == 1


def test_inactive_rows_are_dropped_after_the_step(patched, tmp_path):
    checker = make_checker(tmp_path, "1.0")
    step = Step.make(3, [], torch.float32)
    step.run(blocks=[1, 0, 3])  # the second decode row owns vLLM's null block
    (record,) = records(checker)
    assert record["rows"] == 2 and record["decode_rows"] == 3
    assert differing(record) == dict.fromkeys(FIELDS, 0)


def test_nothing_is_checked_while_a_cuda_graph_is_captured(patched, tmp_path, monkeypatch):
    checker = make_checker(tmp_path, "1.0")
    monkeypatch.setattr(checker_module, "capturing", lambda: True)
    Step.make(2, [], torch.float32).run()
    assert records(checker) == [] and checker.sampler.steps == 0


def test_the_decode_reference_runs_vllms_own_decode_method_when_it_is_patched(
    patched, tmp_path, monkeypatch
):
    """Mode golden replaces _forward_core_decode_non_spec; the decode reference must still be
    vLLM's own (found under the plugin's patch chain)."""
    calls = []
    own = qwen.QwenGatedDeltaNetAttention.__dict__["_forward_core_decode_non_spec"]

    def replaced(self, **kwargs):
        calls.append("replacement")
        return own(self, **kwargs)

    replaced.__gdn_invariant_original__ = own
    monkeypatch.setattr(qwen.QwenGatedDeltaNetAttention, "_forward_core_decode_non_spec", replaced)
    checker = make_checker(tmp_path, "1.0,ref=decode")
    Step.make(2, [], torch.float32).run()
    assert calls == ["replacement"]  # the served step only
    assert differing(records(checker)[0]) == dict.fromkeys(FIELDS, 0)


def test_wrapper_goes_over_the_plugins_own_patch_and_comes_off_in_reverse(monkeypatch):
    monkeypatch.setattr(metrics, "setup_process", lambda: None)
    vllms = qwen.QwenGatedDeltaNetAttention.__dict__["_forward_core"]
    routing, (wrap, _) = routing_patch(), shadow_patches()
    apply_all([routing, wrap])
    routed = qwen.QwenGatedDeltaNetAttention.__dict__["_forward_core"].__gdn_invariant_original__
    assert routed is wrap.original  # the wrapper went over the routing patch's replacement
    assert routed.__wrapped__ is routed_forward_core.routed_forward_core
    with pytest.raises(PatchError, match="already wrapped"):
        shadow_patches()[0].apply()
    wrap.revert()
    assert qwen.QwenGatedDeltaNetAttention.__dict__["_forward_core"] is routed
    routing.revert()
    assert qwen.QwenGatedDeltaNetAttention.__dict__["_forward_core"] is vllms


def test_wrapper_refuses_another_plugins_function(monkeypatch):
    def foreign(self, mixed_qkv, b, a, core_attn_out):
        return None

    monkeypatch.setattr(qwen.QwenGatedDeltaNetAttention, "_forward_core", foreign)
    (wrap, _) = shadow_patches()
    with pytest.raises(PatchError, match="not vLLM's own function"):
        wrap.apply()
    assert qwen.QwenGatedDeltaNetAttention.__dict__["_forward_core"] is foreign
