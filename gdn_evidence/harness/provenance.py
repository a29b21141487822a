"""Where a piece of evidence came from: commit, versions, device, the environment knobs that
change numerics or the kernels vLLM runs."""

from __future__ import annotations

import datetime
import hashlib
import importlib.metadata
import os
import platform
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
ENV_KNOBS = (
    "FLA_USE_FAST_OPS",
    "TRITON_DEFAULT_FP_FUSION",
    "VLLM_BATCH_INVARIANT",
    "VLLM_ENABLE_FLA_PACKED_RECURRENT_DECODE",
    "VLLM_GDN_DECODE_KERNEL",
    "VLLM_SSM_CONV_STATE_LAYOUT",  # which conv-cache layout vLLM's engine ran (unset: SD)
)


def git_state() -> tuple[str | None, bool | None]:
    """(commit, dirty) of the code that runs.

    ``GDN_INVARIANT_GIT_COMMIT``/``_DIRTY`` win when set (a copied tree whose .git is not the
    one it was copied from); otherwise the checkout's ``git`` state, or (None, None).
    """
    commit = os.environ.get("GDN_INVARIANT_GIT_COMMIT")
    if commit:
        dirty = os.environ.get("GDN_INVARIANT_GIT_DIRTY")
        return commit, None if dirty is None else dirty == "1"
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
        status = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        return commit, bool(status.strip())
    except (OSError, subprocess.CalledProcessError):
        return None, None


SOURCE_FOLDERS = ("vllm_gdn_invariant", "scripts")


def source_digest(root: Path = ROOT) -> str:
    """SHA-256 over the project's Python sources (``SOURCE_FOLDERS``), path and content of each
    ``.py`` file in path order: which code ran, whatever the copy's ``.git`` says. Check a
    record against a commit by computing it in a checkout of that commit."""
    digest = hashlib.sha256()
    for folder in SOURCE_FOLDERS:
        for path in sorted((root / folder).rglob("*.py")):
            digest.update(path.relative_to(root).as_posix().encode() + b"\0")
            digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


def provenance(**extra: object) -> dict:
    """Git state, the sources' digest, vLLM/torch/Triton/FlashInfer versions, Python, platform,
    device name and capability ("cpu" and None without CUDA), the numeric knobs' environment
    values, UTC time and argv of this run, then the caller's ``extra`` fields."""
    commit, dirty = git_state()
    try:
        import vllm

        vllm_version = vllm.__version__
    except ImportError:
        vllm_version = None
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    try:
        flashinfer_version = importlib.metadata.version("flashinfer-python")
    except importlib.metadata.PackageNotFoundError:
        flashinfer_version = None
    cuda = torch.cuda.is_available()
    return {
        "git_commit": commit,
        "git_dirty": dirty,
        "source_sha256": source_digest(),
        "vllm": vllm_version,
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "triton": triton_version,
        "flashinfer": flashinfer_version,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "capability": list(torch.cuda.get_device_capability()) if cuda else None,
        "env": {k: os.environ.get(k) for k in ENV_KNOBS},
        "timestamp": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "argv": list(sys.argv),
        **extra,
    }
