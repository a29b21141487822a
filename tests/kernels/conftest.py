"""Fixtures of the kernel tests: the kernels as Triton's interpreter runs them, on CPU tensors.

Triton decides when a ``@triton.jit`` function is decorated whether it is compiled or
interpreted (``TRITON_INTERPRET``). ``kernels`` imports a second copy of
``vllm_gdn_invariant.kernels`` under another module name, with ``TRITON_INTERPRET=1`` set for
that import only; ``probes`` does the same for probes.py. The package that other tests import
stays the compiled one (as on the GPU), and the environment is restored before any test runs.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

import pytest

import vllm_gdn_invariant.kernels

KERNELS_DIR = Path(vllm_gdn_invariant.kernels.__file__).parent
PROBES_FILE = Path(__file__).with_name("probes.py")
INTERPRETED_KERNELS = "gdn_invariant_kernels_interpreted"
INTERPRETED_PROBES = "gdn_invariant_kernel_probes_interpreted"


def import_interpreted(name: str, path: Path) -> ModuleType:
    """Import the module or package at ``path`` as ``name`` with TRITON_INTERPRET=1 set for the
    import only (once; later calls return the same module)."""
    if name in sys.modules:
        return sys.modules[name]
    package = path.is_dir()
    spec = importlib.util.spec_from_file_location(
        name,
        path / "__init__.py" if package else path,
        submodule_search_locations=[str(path)] if package else None,
    )
    module = importlib.util.module_from_spec(spec)
    saved = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        for loaded in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
            del sys.modules[loaded]
        raise
    finally:
        if saved is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = saved
    return module


def import_mutated_recurrent(name: str, old: str, new: str, directory: Path) -> ModuleType:
    """kernels/recurrent.py with its one ``old`` replaced by ``new`` (it must be there once),
    written to ``directory`` and imported interpreted as ``INTERPRETED_KERNELS.name``."""
    source = (KERNELS_DIR / "recurrent.py").read_text()
    assert source.count(old) == 1, f"the kernel no longer has {old!r}"
    path = directory / f"{name}.py"
    path.write_text(source.replace(old, new))
    return import_interpreted(f"{INTERPRETED_KERNELS}.{name}", path)


def import_interpreted_submodule(name: str) -> ModuleType:
    """Submodule ``name`` of the interpreted kernels package, imported with TRITON_INTERPRET=1
    set for the import only (a module with jit functions of its own needs it)."""
    import_interpreted(INTERPRETED_KERNELS, KERNELS_DIR)
    saved = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        return importlib.import_module(f"{INTERPRETED_KERNELS}.{name}")
    finally:
        if saved is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = saved


@pytest.fixture(scope="session")
def kernels() -> ModuleType:
    """vllm_gdn_invariant.kernels, interpreted: ``kernels.recurrent_step`` etc. on CPU tensors."""
    module = import_interpreted(INTERPRETED_KERNELS, KERNELS_DIR)
    assert module.recurrent.INTERPRETED and module.elementary.BF16_ON_BITS
    return module


@pytest.fixture(scope="session")
def probes(kernels: ModuleType) -> ModuleType:
    """probes.py, interpreted."""
    return import_interpreted(INTERPRETED_PROBES, PROBES_FILE)
