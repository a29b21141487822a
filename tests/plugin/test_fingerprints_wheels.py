"""The fingerprint table against the published wheels of every supported vLLM version."""

import pytest

from vllm_gdn_invariant.patches import patches_for
from vllm_gdn_invariant.plugin.config import Mode, PluginConfig
from vllm_gdn_invariant.plugin.fingerprint import SourceTarget
from vllm_gdn_invariant.plugin.versions import (
    FINGERPRINTS,
    FORWARD_CORE,
    InstalledVllm,
    TargetState,
    check_targets,
)

from ..conftest import SUPPORTED_CUDA_VERSIONS

pytestmark = pytest.mark.wheels


def all_targets():
    patches = patches_for(PluginConfig(mode=Mode.GOLDEN))
    pairs = [(p.target, "replaced") for p in patches]
    pairs += [(t, "relied on") for p in patches for t in p.relies_on]
    return pairs


def test_every_cuda_version_has_a_table_entry():
    assert {v for d, v in FINGERPRINTS if d == "vllm"} == set(SUPPORTED_CUDA_VERSIONS)


@pytest.mark.parametrize("version", SUPPORTED_CUDA_VERSIONS)
def test_table_matches_the_wheel_source(version, wheel_source):
    def reader(target: SourceTarget) -> str:
        return wheel_source(version, target.path_in_package)

    result = check_targets(all_targets(), InstalledVllm("vllm", version), read_source=reader)
    assert result.ok, result.refusal
    assert all(c.state is TargetState.MATCH for c in result.checks)
    assert {c.target.key for c in result.checks} <= set(FINGERPRINTS[("vllm", version)])


@pytest.mark.parametrize("version", SUPPORTED_CUDA_VERSIONS)
def test_altered_source_is_refused_and_named(version, wheel_source):
    statement = "num_decode_tokens = attn_metadata.num_decode_tokens\n"

    def reader(target: SourceTarget) -> str:
        text = wheel_source(version, target.path_in_package)
        if target == FORWARD_CORE:
            assert statement in text
            text = text.replace(statement, statement.replace("\n", " + 0\n"), 1)
        return text

    result = check_targets(all_targets(), InstalledVllm("vllm", version), read_source=reader)
    assert not result.ok
    assert "QwenGatedDeltaNetAttention._forward_core (replaced) mismatch" in result.refusal
    states = {c.target: c.state for c in result.checks}
    assert states[FORWARD_CORE] is TargetState.MISMATCH
    assert sum(s is TargetState.MISMATCH for s in states.values()) == 1
