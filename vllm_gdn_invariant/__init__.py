"""Batch-invariant Gated DeltaNet decode for Qwen3-Next / Qwen3.5 in vLLM."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("vllm-gdn-invariant")
except PackageNotFoundError:
    __version__ = "0.0.0+unknown"
