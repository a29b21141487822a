"""Run ``doctor`` for several cases in one process, so vLLM is imported once.

``python doctor_runner.py CASES.json RESULTS.json``: each case is ``{"argv": [...], "env":
{...}, "refuse": bool, "as_cuda": bool}``; each result is ``{"code", "stdout", "stderr"}``.

* ``refuse``: the installed build's fingerprint table is replaced by wrong values for the run,
  so the plugin's guard refuses as it would for a changed vLLM source.
* ``as_cuda``: doctor's platform check answers "CUDA" for the run (everything else, vLLM's
  config and its prefill backend included, is what this machine gives), so the routed-steps
  lines show how vLLM's config shapes them.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
from typing import Any

from vllm_gdn_invariant.cli import doctor, main
from vllm_gdn_invariant.plugin import versions
from vllm_gdn_invariant.plugin.platform import PlatformCheck


def run_case(case: dict[str, Any]) -> dict[str, Any]:
    env = case.get("env", {})
    saved_env = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    installed = versions.installed_vllm()
    key = (installed.distribution, installed.release)
    saved_table = versions.FINGERPRINTS[key]
    if case.get("refuse"):
        versions.FINGERPRINTS[key] = {name: "0" * 16 for name in saved_table}
    saved_read_platform = doctor.read_platform
    if case.get("as_cuda"):
        doctor.read_platform = lambda: (PlatformCheck("CudaPlatform", "cuda"), None)
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(case["argv"], prog="vllm-gdn-invariant")
            except SystemExit as stop:
                code = stop.code
    finally:
        versions.FINGERPRINTS[key] = saved_table
        doctor.read_platform = saved_read_platform
        for name, value in saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    return {"code": code, "stdout": out.getvalue(), "stderr": err.getvalue()}


if __name__ == "__main__":
    cases_path, results_path = sys.argv[1:3]
    with open(cases_path, encoding="utf-8") as fh:
        cases = json.load(fh)
    results = {name: run_case(case) for name, case in cases.items()}
    with open(results_path, "w", encoding="utf-8") as fh:
        json.dump(results, fh, indent=1)
