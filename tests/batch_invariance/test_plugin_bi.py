"""The plugin under ``VLLM_BATCH_INVARIANT=1``: which patches, the log line, the all-or-nothing
guard, and the switch read as vLLM reads it."""

from __future__ import annotations

import functools

import pytest

from vllm_gdn_invariant.patches import applied, batch_invariance_patches
from vllm_gdn_invariant.patches.base import PATCH_ATTR
from vllm_gdn_invariant.patches.bi_patch import GROUP
from vllm_gdn_invariant.patches.bi_selector import GET_ATTN_BACKEND
from vllm_gdn_invariant.plugin import entry
from vllm_gdn_invariant.plugin.config import ConfigError, Mode, PluginConfig
from vllm_gdn_invariant.plugin.versions import FINGERPRINTS, check_targets, installed_release
from vllm_gdn_invariant.plugin.vllm_env import BATCH_INVARIANT

LABELS = (
    "qwen-gdn-backend",
    "triton-prefill",
    "float32-gdn-state",
    "chunk-grid-64",
    "align-block-64",
    "no-one-token-tail-hit",
    "gated-norm-rows-1",
)


@pytest.fixture
def batch_invariant(monkeypatch):
    monkeypatch.setenv("VLLM_BATCH_INVARIANT", "1")


def test_batch_invariant_mode_adds_its_patches_after_the_routing(batch_invariant):
    patches = entry.patches_for(PluginConfig(mode=Mode.ROUTE))
    assert patches[0].name == "QwenGatedDeltaNetAttention._forward_core"
    invariance = [p for p in patches if p.group == GROUP]
    assert tuple(dict.fromkeys(p.name for p in invariance))[: len(LABELS)] == LABELS


def test_without_the_mode_only_the_routing_is_installed(monkeypatch):
    monkeypatch.delenv("VLLM_BATCH_INVARIANT", raising=False)
    patches = entry.patches_for(PluginConfig(mode=Mode.ROUTE))
    assert not any(p.group == GROUP for p in patches)


def test_mode_off_patches_nothing_under_batch_invariant_mode(batch_invariant):
    status = entry.plan(PluginConfig(mode=Mode.OFF))
    assert status.patches == () and status.action() == "nothing patched (mode off)"


@pytest.mark.parametrize(
    "release, tile, fused_norm",
    [("0.26.0", False, False), ("0.32.0", False, False), ("0.33.0", True, False),
     ("0.34.0", True, True)],
)  # fmt: skip
def test_release_specific_patches(release, tile, fused_norm):
    patches = batch_invariance_patches(release)
    names = [p.name for p in patches]
    assert ("blackwell-decode-tile" in names) == tile
    assert (sum(n == "gated-norm-rows-1" for n in names) == 2) == fused_norm


def test_the_log_line_names_the_batch_invariance_patches(batch_invariant):
    status = entry.plan(PluginConfig(mode=Mode.ROUTE))
    assert status.refusal is None, status.refusal
    action = status.action()
    routing, _, invariance = action.partition("; VLLM_BATCH_INVARIANT=1: ")
    assert routing.startswith("would patch QwenGatedDeltaNetAttention._forward_core")
    for label in LABELS:
        assert label in invariance


def test_a_changed_batch_invariance_target_refuses_everything(batch_invariant, monkeypatch):
    release = installed_release()
    table = {key: dict(value) for key, value in FINGERPRINTS.items()}
    for (_, version), entries in table.items():
        if version == release:
            entries[GET_ATTN_BACKEND.key] = "0" * 16
    altered = functools.partial(check_targets, fingerprints=table)
    monkeypatch.setattr(entry, "check_targets", altered)
    status = entry.plan(PluginConfig(mode=Mode.ROUTE))
    assert status.refusal is not None and "MambaBase.get_attn_backend (replaced) mismatch" in (
        status.refusal
    )
    assert not status.will_patch and status.action().startswith("nothing patched")


def test_every_patch_applies_and_reverts_to_vllms_own(batch_invariant):
    patches = batch_invariance_patches(installed_release())
    originals = [p.current() for p in patches]
    with applied(patches):
        for patch, original in zip(patches, originals, strict=True):
            live = patch.current()
            inner = getattr(live, "__func__", live)
            assert getattr(inner, PATCH_ATTR, None) is original
    assert all(p.current() is o for p, o in zip(patches, originals, strict=True))


@pytest.mark.parametrize("value", ["0", "1", "2", "-1"])
def test_the_switch_is_read_as_vllm_reads_it(monkeypatch, value):
    import vllm.envs as envs

    monkeypatch.setenv("VLLM_BATCH_INVARIANT", value)
    assert BATCH_INVARIANT.read().enabled is envs.VLLM_BATCH_INVARIANT


def test_a_value_vllm_cannot_read_raises_a_clear_error(monkeypatch):
    import vllm.envs as envs

    monkeypatch.setenv("VLLM_BATCH_INVARIANT", "yes")
    with pytest.raises(ValueError):
        envs.VLLM_BATCH_INVARIANT  # noqa: B018 - vLLM raises too
    with pytest.raises(ConfigError, match="VLLM_BATCH_INVARIANT='yes' is not valid; valid values"):
        BATCH_INVARIANT.read()
