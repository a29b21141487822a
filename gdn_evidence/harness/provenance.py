"""Where a piece of evidence came from: commit, versions, device, the environment knobs that
change numerics or the kernels vLLM runs."""

from __future__ import annotations

import datetime
import hashlib
import importlib.metadata
import json
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


SOURCE_FOLDERS = ("vllm_gdn_invariant", "scripts")
RECORD_FOLDERS = (*SOURCE_FOLDERS, "gdn_evidence", "tests")  # what a commit record's digest covers
COMMIT_RECORD = ".device-commit"  # written by scripts/record_commit.py, ignored by git


def recorded_commit(root: Path = ROOT) -> tuple[str, bool] | None:
    """(commit, dirty) from ``root``'s ``COMMIT_RECORD``, where its ``tree_sha256`` is the
    digest of ``root``'s Python files in ``RECORD_FOLDERS``: the record names the tree that runs,
    and a record left over from another tree is not used. None where there is no such record."""
    try:
        record = json.loads((root / COMMIT_RECORD).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or not {"git_commit", "git_dirty"} <= record.keys():
        return None
    if record.get("tree_sha256") != source_digest(root, RECORD_FOLDERS):
        return None
    return record["git_commit"], record["git_dirty"]


def git_state(root: Path = ROOT) -> tuple[str | None, bool | None]:
    """(commit, dirty) of the code that runs.

    ``GDN_INVARIANT_GIT_COMMIT``/``_DIRTY`` win when set. Otherwise the checkout's ``git``
    state where it is clean; where it is not, or there is no ``git``, the checkout's commit
    record (``recorded_commit``) where there is one: a copied tree whose .git is not the one it
    was copied from (the GPU machine's copy) reads as dirty against that .git's HEAD. Without
    either, the ``git`` state as it is, or (None, None).
    """
    commit = os.environ.get("GDN_INVARIANT_GIT_COMMIT")
    if commit:
        dirty = os.environ.get("GDN_INVARIANT_GIT_DIRTY")
        return commit, None if dirty is None else dirty == "1"
    commit, dirty = checkout_git_state(root)
    if commit is not None and dirty is False:
        return commit, dirty
    recorded = recorded_commit(root)
    return recorded if recorded is not None else (commit, dirty)


def checkout_git_state(root: Path = ROOT) -> tuple[str | None, bool | None]:
    """(HEAD, whether tracked files differ from it) of the git checkout at ``root``, or (None,
    None) where there is none."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True
        ).stdout.strip()
        status = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        return commit, bool(status.strip())
    except (OSError, subprocess.CalledProcessError):
        return None, None


def source_digest(root: Path = ROOT, folders: tuple[str, ...] = SOURCE_FOLDERS) -> str:
    """SHA-256 over the project's Python sources (``folders``, by default ``SOURCE_FOLDERS``),
    path and content of each ``.py`` file in path order: which code ran, whatever the copy's
    ``.git`` says. Check a record against a commit by computing it in a checkout of that
    commit."""
    digest = hashlib.sha256()
    for folder in folders:
        for path in sorted((root / folder).rglob("*.py")):
            digest.update(path.relative_to(root).as_posix().encode() + b"\0")
            digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


def record_commit(root: Path = ROOT) -> dict:
    """Write ``root``'s commit record (``COMMIT_RECORD``): its checkout's HEAD, whether tracked
    files differ from it, and the digest of its Python files in ``RECORD_FOLDERS``. Returns the
    record."""
    commit, dirty = checkout_git_state(root)
    if commit is None:
        raise RuntimeError(f"{root} is not a git checkout: no commit to record")
    tree = source_digest(root, RECORD_FOLDERS)
    record = {"git_commit": commit, "git_dirty": dirty, "tree_sha256": tree}
    (root / COMMIT_RECORD).write_text(json.dumps(record) + "\n")
    return record


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
