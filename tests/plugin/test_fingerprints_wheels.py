"""The fingerprint table against the published wheels of every supported vLLM version."""

import pytest

from vllm_gdn_invariant.patches import SourceTarget, every_patch
from vllm_gdn_invariant.patches.routing import FLASHINFER_PLAN, FORWARD_CORE, METADATA_CLASS
from vllm_gdn_invariant.plugin.versions import (
    FINGERPRINTS,
    SUPPORTED_VERSIONS,
    InstalledVllm,
    TargetState,
    check_targets,
    guarded_targets,
)

# a version's first test downloads its wheel (~300 MB) when the cache lacks it
pytestmark = [pytest.mark.wheels, pytest.mark.timeout(1200)]


def all_targets():
    return guarded_targets(every_patch())  # every mode's and every release's


def wheel_reader(version, wheel_source, edit=None):
    def reader(target: SourceTarget) -> str | None:
        try:
            text = wheel_source(version, target.path_in_package)
        except KeyError:  # the module is not in that wheel
            return None
        return text if edit is None else edit(target, text)

    return reader


def test_every_cuda_version_has_a_table_entry():
    assert {v for d, v in FINGERPRINTS if d == "vllm"} == set(SUPPORTED_VERSIONS)


@pytest.mark.parametrize("version", SUPPORTED_VERSIONS)
def test_table_matches_the_wheel_source(version, wheel_source):
    result = check_targets(
        all_targets(),
        InstalledVllm("vllm", version),
        read_source=wheel_reader(version, wheel_source),
    )
    assert result.ok, result.refusal
    states = {c.target: c.state for c in result.checks}
    assert set(states.values()) <= {TargetState.MATCH, TargetState.ABSENT}
    assert states[FORWARD_CORE] is TargetState.MATCH
    assert {c.target.key for c in result.checks if c.state is TargetState.MATCH} == set(
        FINGERPRINTS[("vllm", version)]
    )


@pytest.mark.parametrize("version", SUPPORTED_VERSIONS)
def test_altered_source_is_refused_and_named(version, wheel_source):
    statement = "num_decode_tokens = attn_metadata.num_decode_tokens\n"

    def edit(target, text):
        if target == FORWARD_CORE:
            assert statement in text
            text = text.replace(statement, statement.replace("\n", " + 0\n"), 1)
        return text

    result = check_targets(
        all_targets(),
        InstalledVllm("vllm", version),
        read_source=wheel_reader(version, wheel_source, edit),
    )
    assert not result.ok
    assert "QwenGatedDeltaNetAttention._forward_core (replaced) mismatch" in result.refusal
    states = {c.target: c.state for c in result.checks}
    assert states[FORWARD_CORE] is TargetState.MISMATCH
    assert sum(s is TargetState.MISMATCH for s in states.values()) == 1


def test_a_changed_metadata_field_is_refused(wheel_source):
    def edit(target, text):
        if target == METADATA_CLASS:
            return text.replace(
                "    num_decode_tokens: int\n", "    num_decode_tokens: int = 0\n", 1
            )
        return text

    result = check_targets(
        all_targets(),
        InstalledVllm("vllm", "0.34.0"),
        read_source=wheel_reader("0.34.0", wheel_source, edit),
    )
    assert "GDNAttentionMetadata (relied on) mismatch" in result.refusal


def test_a_function_appearing_where_the_table_says_it_does_not_exist_is_refused(wheel_source):
    plan_source = wheel_source("0.34.0", FLASHINFER_PLAN.path_in_package)
    start = plan_source.index("def plan_flashinfer_checkpoints")
    end = plan_source.index("@dataclass", start)

    def edit(target, text):
        return text + "\n\n" + plan_source[start:end] if target == FLASHINFER_PLAN else text

    result = check_targets(
        all_targets(),
        InstalledVllm("vllm", "0.30.0"),
        read_source=wheel_reader("0.30.0", wheel_source, edit),
    )
    assert "plan_flashinfer_checkpoints (relied on) present, not in this version's table" in (
        result.refusal
    )
