"""scripts/h200_engine_stage.sh sets the engine up in two calls after stage.sh: ``moe`` unpacks
vLLM's Python code and both op libraries, ``deps`` the Python packages and the mark enter.sh
looks for; each refuses to run out of order."""

from __future__ import annotations

import io
import lzma
import os
import subprocess
import tarfile
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "h200_engine_stage.sh"


def tar_xz(path: Path, files: dict[str, bytes]) -> None:
    with tarfile.open(path, "w:xz") as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))


@pytest.fixture
def bundle(tmp_path: Path) -> tuple[Path, Path]:
    """A project folder with a small .device-engine, and the target with stage.sh's library."""
    project, target = tmp_path / "project", tmp_path / "engine"
    engine = project / ".device-engine"
    engine.mkdir(parents=True)
    tar_xz(engine / "vllm-0.26.0.tar.xz", {"vllm/__init__.py": b"# vllm\n"})
    (engine / "moe.xz").write_bytes(lzma.compress(b"moe library"))
    tar_xz(engine / "deps.tar.xz", {"torch_dep/__init__.py": b"# dep\n"})
    (engine / "sitecustomize.py").write_text("# stubs\n")
    (engine / "enter.sh").write_text("# enter\n")
    target.mkdir()
    (target / "_C_stable_libtorch.abi3.so").write_bytes(b"C library")
    return project, target


def stage(project: Path, target: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "GDN_ENGINE_ROOT": str(target)}
    return subprocess.run(
        ["bash", str(SCRIPT), *args], cwd=project, env=env, capture_output=True, text=True
    )


def test_moe_then_deps_leave_the_engine_set_up(bundle):
    project, target = bundle
    assert stage(project, target, "moe").returncode == 0
    package = target / "vllm" / "vllm"
    assert (package / "__init__.py").read_text() == "# vllm\n"
    assert (package / "_moe_C_stable_libtorch.abi3.so").read_bytes() == b"moe library"
    assert (package / "_C_stable_libtorch.abi3.so").read_bytes() == b"C library"
    assert not (target / ".done").exists()
    assert stage(project, target, "deps").returncode == 0
    assert (target / "site" / "torch_dep" / "__init__.py").exists()
    assert (target / "site" / "sitecustomize.py").read_text() == "# stubs\n"
    assert (target / "enter.sh").read_text() == "# enter\n"
    assert (target / ".done").exists()


def test_deps_before_moe_is_refused(bundle):
    project, target = bundle
    done = stage(project, target, "deps")
    assert done.returncode == 1 and "run h200_engine_stage.sh moe first" in done.stderr
    assert not (target / "site").exists() and not (target / ".done").exists()


def test_a_fresh_machine_is_sent_to_stage_sh(bundle):
    project, target = bundle
    (target / "_C_stable_libtorch.abi3.so").unlink()
    done = stage(project, target, "moe")
    assert done.returncode == 1 and ".device-engine-so/stage.sh first" in done.stderr
    assert not (target / "vllm").exists()


def test_an_unknown_part_is_a_usage_error(bundle):
    project, target = bundle
    done = stage(project, target, "all")
    assert done.returncode == 2 and "usage: h200_engine_stage.sh moe|deps" in done.stderr
