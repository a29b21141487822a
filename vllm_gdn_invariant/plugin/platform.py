"""The platforms the plugin patches on.

* CUDA: decode-only steps run ``_forward_core_decode_non_spec`` (Triton packed decode), the
  path routed mixed steps give their decode rows.
* vLLM's CPU build: GDN layers run ``forward_cpu`` (``cpu_gdn_attention_core``), which never
  calls ``_forward_core``; the patch is installed and inert there.
* Everything else is refused. On ROCm with AITER, decode-only steps take
  ``_forward_core_decode_aiter`` while routed mixed steps would take the Triton packed decode,
  so decode rows would still differ; XPU and other platforms run GDN layers through their own
  ``forward_*`` methods, which the routing has not been checked against.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PlatformCheck:
    """vLLM's current platform and whether the plugin patches on it."""

    name: str
    device_type: str
    refusal: str | None = None

    @property
    def ok(self) -> bool:
        return self.refusal is None

    @property
    def is_cpu(self) -> bool:
        return self.device_type == "cpu"


def platform_verdict(name: str, device_type: str, *, cuda: bool, cpu: bool, rocm: bool):
    """The check for a platform described by vLLM's ``is_cuda``/``is_cpu``/``is_rocm``."""
    if cuda or cpu:
        return PlatformCheck(name, device_type)
    if rocm:
        reason = (
            f"platform {name} (ROCm) is not supported: its decode-only steps run "
            "_forward_core_decode_aiter, so routed decode rows would still differ"
        )
    else:
        reason = (
            f"platform {name} ({device_type or 'unknown device'}) is not supported: "
            "the plugin patches on CUDA and on vLLM's CPU build only"
        )
    return PlatformCheck(name, device_type, reason)


def check_platform() -> PlatformCheck:
    """Ask vLLM which platform this process runs on (no CUDA context is created)."""
    from vllm.platforms import current_platform

    return platform_verdict(
        type(current_platform).__name__,
        str(getattr(current_platform, "device_type", "")),
        cuda=current_platform.is_cuda(),
        cpu=current_platform.is_cpu(),
        rocm=current_platform.is_rocm(),
    )
