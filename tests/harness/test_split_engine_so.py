"""scripts/split_engine_so.sh: vLLM's _C library carried to the GPU machine in two pieces comes
out whole, or not at all (pieces out of order or damaged)."""

from __future__ import annotations

import lzma
import os
import random
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LIBRARY = "_C_stable_libtorch.abi3.so"

pytestmark = pytest.mark.skipif(
    not all(shutil.which(tool) for tool in ("bash", "git", "xz", "split", "sha256sum")),
    reason="needs bash, git, xz, split and sha256sum",
)


@pytest.fixture
def checkout(tmp_path: Path) -> tuple[Path, bytes]:
    """A git checkout with a compressed stand-in library at .device-engine-so/c.xz."""
    tree = tmp_path / "tree"
    (tree / ".device-engine-so").mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(tree)], check=True)
    library = random.Random(0).randbytes(300_000)
    (tree / ".device-engine-so" / "c.xz").write_bytes(lzma.compress(library))
    subprocess.run(["bash", str(ROOT / "scripts" / "split_engine_so.sh")], cwd=tree, check=True)
    return tree, library


def stage(tree: Path, piece: int, engine: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(tree / f".device-engine-so-{piece}" / "stage.sh")],
        env={**os.environ, "GDN_ENGINE_ROOT": str(engine)},
        capture_output=True,
        text=True,
        check=False,
    )


def test_the_two_pieces_unpack_to_the_library(checkout, tmp_path):
    tree, library = checkout
    pieces = [sorted((tree / f".device-engine-so-{i}").glob("cpart.*")) for i in (1, 2)]
    assert [len(p) for p in pieces] == [1, 1]
    exclude = (tree / ".git" / "info" / "exclude").read_text().splitlines()
    assert "/.device-engine-so-1/" in exclude and "/.device-engine-so-2/" in exclude
    engine = tmp_path / "engine"
    assert stage(tree, 1, engine).returncode == 0
    assert not (engine / LIBRARY).exists()
    done = stage(tree, 2, engine)
    assert done.returncode == 0, done.stderr
    assert (engine / LIBRARY).read_bytes() == library


def test_the_second_piece_alone_is_refused(checkout, tmp_path):
    tree, _ = checkout
    done = stage(tree, 2, tmp_path / "engine")
    assert done.returncode == 1 and "run .device-engine-so-1/stage.sh first" in done.stderr
    assert not (tmp_path / "engine" / LIBRARY).exists()


def test_a_damaged_piece_fails_the_digest_and_writes_nothing(checkout, tmp_path):
    tree, _ = checkout
    piece = next((tree / ".device-engine-so-2").glob("cpart.*"))
    data = bytearray(piece.read_bytes())
    data[100] ^= 0xFF
    piece.write_bytes(bytes(data))
    engine = tmp_path / "engine"
    assert stage(tree, 1, engine).returncode == 0
    done = stage(tree, 2, engine)
    assert done.returncode != 0
    assert not (engine / LIBRARY).exists()
