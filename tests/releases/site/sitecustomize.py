"""Loaded at interpreter start in a release run (``tests/releases``): vLLM's compiled extensions
of a CUDA wheel are not extracted, so their modules import as empty ones.

Only the Python code of the release runs; every GDN kernel is replaced by the tests' CPU
stand-ins, so no native op is ever called.
"""

import importlib.abc
import importlib.machinery
import os
import sys
import types

NATIVE_MODULES = {
    "vllm._C",
    "vllm._C_stable_libtorch",
    "vllm._moe_C",
    "vllm._moe_C_stable_libtorch",
    "vllm.cumem_allocator",
    "vllm._flashmla_C",
    "vllm._flashmla_extension_C",
    "vllm.vllm_flash_attn._vllm_fa2_C",
    "vllm.vllm_flash_attn._vllm_fa3_C",
}


class EmptyNativeModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        if name in NATIVE_MODULES:
            return importlib.machinery.ModuleSpec(name, self)
        return None

    def create_module(self, spec):
        return types.ModuleType(spec.name)

    def exec_module(self, module):
        pass


if os.environ.get("GDN_INVARIANT_RELEASE_RUN") == "1":
    sys.meta_path.insert(0, EmptyNativeModules())
