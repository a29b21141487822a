"""``plugin.scope.routing_scope``: which steps are routed, case by case.

Each case states the whole answer it expects (routed steps, steps left to vLLM, why nothing is
routed, the notes); ``test_no_case_accepts_another_cases_answer`` checks that every case's
expectation rejects the answer of every other case, so no two cases can be confused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from vllm_gdn_invariant.plugin.platform import PlatformCheck, platform_verdict
from vllm_gdn_invariant.plugin.scope import RoutingScope, Step, routing_scope

CUDA = PlatformCheck("CudaPlatform", "cuda")
CPU = PlatformCheck("CpuPlatform", "cpu")
ROCM = platform_verdict("RocmPlatform", "cuda", cuda=False, cpu=False, rocm=True)

NOT_SPEC = (Step.DECODE_ONLY, Step.PREFILL_ONLY, Step.MULTI_TOKEN_DECODES)
WITH_SPEC = (Step.DECODE_ONLY, Step.PREFILL_ONLY, Step.SPECULATIVE, Step.MULTI_TOKEN_DECODES)
KNOWN = dict(speculative=False, prefill_backend="triton", mamba_cache_mode="none")


@dataclass(frozen=True)
class Expect:
    """The whole expected answer: ``none`` and ``notes`` are substrings, one per note."""

    routed: tuple[Step, ...] = (Step.MIXED,)
    left: tuple[Step, ...] = NOT_SPEC
    none: str | None = None
    notes: tuple[str, ...] = ()

    def check(self, scope: RoutingScope) -> None:
        assert scope.routed == self.routed
        assert scope.left_to_vllm == (tuple(Step) if self.none else self.left)
        if self.none is None:
            assert scope.none_because is None
        else:
            assert self.none in (scope.none_because or "")
        assert len(scope.notes) == len(self.notes), scope.notes
        for want, note in zip(self.notes, scope.notes, strict=True):
            assert want in note, (want, note)


def nothing(reason: str) -> Expect:
    return Expect(routed=(), none=reason)


CASES: dict[str, tuple[dict[str, Any], Expect]] = {
    "mode off": (
        dict(platform=CUDA, packed_decode=True, not_patched="mode off", **KNOWN),
        nothing("the plugin patches nothing: mode off"),
    ),
    "platform unreadable": (
        dict(platform=None, packed_decode=True, **KNOWN),
        nothing("platform could not be read"),
    ),
    "ROCm refused": (
        dict(platform=ROCM, packed_decode=True, **KNOWN),
        nothing("_forward_core_decode_aiter"),
    ),
    "CPU": (
        dict(platform=CPU, packed_decode=True, **KNOWN),
        nothing("GDN layers run forward_cpu, which does not call _forward_core"),
    ),
    "packed decode off": (
        dict(platform=CUDA, packed_decode=False, **KNOWN),
        nothing("vLLM runs every decode row through one kernel"),
    ),
    "CUDA triton, no spec, no prefix caching": (
        dict(platform=CUDA, packed_decode=True, vllm_version="0.32.0", **KNOWN),
        Expect(notes=("vLLM's triton prefill",)),
    ),
    "CUDA triton, speculative decoding": (
        dict(
            platform=CUDA,
            packed_decode=True,
            speculative=True,
            prefill_backend="triton",
            mamba_cache_mode="none",
        ),
        Expect(left=WITH_SPEC, notes=("vLLM's triton prefill",)),
    ),
    "CUDA flashinfer align on 0.34": (
        dict(
            platform=CUDA,
            packed_decode=True,
            speculative=False,
            prefill_backend="flashinfer",
            mamba_cache_mode="align",
            vllm_version="0.34.0",
        ),
        Expect(notes=("vLLM's flashinfer prefill", "rebases their rows")),
    ),
    "CUDA flashinfer align on 0.32": (
        dict(
            platform=CUDA,
            packed_decode=True,
            speculative=False,
            prefill_backend="flashinfer",
            mamba_cache_mode="align",
            vllm_version="0.32.0",
        ),
        Expect(notes=("vLLM's flashinfer prefill", "no checkpoints inside prefills on vLLM 0.32")),
    ),
    "CUDA triton align on 0.34": (
        dict(
            platform=CUDA,
            packed_decode=True,
            speculative=False,
            prefill_backend="triton",
            mamba_cache_mode="align",
            vllm_version="0.34.0",
        ),
        Expect(notes=("vLLM's triton prefill", "no checkpoints inside prefills with triton")),
    ),
    "CUDA cutedsl": (
        dict(
            platform=CUDA,
            packed_decode=True,
            speculative=False,
            prefill_backend="cutedsl",
            mamba_cache_mode="none",
        ),
        Expect(notes=("the routing was not written for",)),
    ),
    "CUDA, vLLM config not known": (
        dict(platform=CUDA, packed_decode=True),
        Expect(
            left=WITH_SPEC,
            notes=("not known: speculative decoding, prefill backend, mamba cache mode",),
        ),
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_each_case_gets_its_answer(name):
    inputs, expect = CASES[name]
    expect.check(routing_scope(**inputs))


def test_no_case_accepts_another_cases_answer():
    answers = {name: routing_scope(**inputs) for name, (inputs, _) in CASES.items()}
    confused = []
    for name, (_, expect) in CASES.items():
        for other, answer in answers.items():
            if other == name:
                continue
            try:
                expect.check(answer)
            except AssertionError:
                continue
            confused.append((name, other))
    assert confused == []


def test_routed_and_left_texts_state_the_steps():
    routed = routing_scope(platform=CUDA, packed_decode=True, **KNOWN)
    assert routed.routed_text() == (
        "mixed decode+prefill steps without speculative rows whose decode rows carry one token; "
        "prefill rows run vLLM's triton prefill on the prefill tail"
    )
    assert routed.left_text() == (
        "decode-only steps, prefill-only steps, "
        "mixed steps whose decode rows carry more than one token"
    )
    cpu = routing_scope(platform=CPU, packed_decode=True)
    assert cpu.routed_text().startswith("no step (CPU platform:")
    assert cpu.left_text() == "every step"


def test_the_plugin_not_patching_outranks_the_platform_and_packed_decode():
    scope = routing_scope(platform=CPU, packed_decode=False, not_patched="mode off")
    assert scope.none_because == "the plugin patches nothing: mode off"
