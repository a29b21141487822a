"""The checker's Prometheus metrics reach the process that serves /metrics.

Each case runs in fresh interpreters, as vLLM's API server and workers do: the metrics are
counted in one process and collected in another.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from prometheus_client.parser import text_string_to_metric_families

from vllm_gdn_invariant.shadow.metrics import EXPORT_DIR_ENV, MULTIPROC_ENV

WORKER = """
from vllm_gdn_invariant.shadow.metrics import ShadowMetrics, export_dir
m = ShadowMetrics(export_dir())
for layer in ("model.layers.0.linear_attn", "model.layers.1.linear_attn"):
    m.observe_check(layer=layer, reference="golden", provider="routed", step_kind="mixed",
                    rows=3, max_ulp={"output": 0, "recurrent_state": 5, "conv_state": 0},
                    differing={"output": 0, "recurrent_state": 12, "conv_state": 0})
m.observe_failure("reference")
m.export_now()
"""


def python(code: str, env: dict) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return proc


def samples(text: str) -> dict[tuple, float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def clean_env() -> dict:
    return {k: v for k, v in os.environ.items() if k not in (EXPORT_DIR_ENV, MULTIPROC_ENV)}


def check_totals(values: dict, workers: int) -> None:
    layer0 = (("layer", "model.layers.0.linear_attn"),)
    checks = "gdn_invariant_shadow_checks_total"
    key = (
        checks,
        (*layer0, ("provider", "routed"), ("reference", "golden"), ("step_kind", "mixed")),
    )
    assert values[key] == workers
    differ = "gdn_invariant_shadow_checks_with_difference_total"
    key = (differ, (("field", "recurrent_state"), *layer0, ("reference", "golden")))
    assert values[key] == workers
    assert (differ, (("field", "output"), *layer0, ("reference", "golden"))) not in values
    failures = ("gdn_invariant_shadow_failures_total", (("stage", "reference"),))
    assert values[failures] == workers
    bucket = "gdn_invariant_shadow_max_ulp_bucket"
    layer1 = ("layer", "model.layers.1.linear_attn")
    max_ulp_5 = (("field", "recurrent_state"), layer1, ("le", "8.0"), ("reference", "golden"))
    assert values[(bucket, max_ulp_5)] == workers
    assert not any(name.endswith("_created") for name, _ in values)


def test_workers_metrics_are_summed_on_the_default_registry_of_the_serving_process(tmp_path):
    """vLLM's default (one API server): the first process sets up the export folder, its
    children export there, and its default registry (what /metrics serves) sums them."""
    code = f"""
    import os, subprocess, sys
    from prometheus_client import REGISTRY, generate_latest
    from vllm_gdn_invariant.shadow.metrics import setup_process, EXPORT_DIR_ENV
    folder = setup_process()
    assert os.environ[EXPORT_DIR_ENV] == folder and os.path.isdir(folder)
    for _ in range(2):  # two workers, started after the plugin loaded
        subprocess.run([sys.executable, "-c", {WORKER!r}], check=True)
    sys.stdout.write(generate_latest(REGISTRY).decode())
    """
    values = samples(python(code, clean_env()).stdout)
    check_totals(values, workers=2)


def test_in_prometheus_multiprocess_mode_vllms_registry_collects_them(tmp_path):
    """PROMETHEUS_MULTIPROC_DIR set (by the user, or by vLLM for several API servers):
    prometheus_client's own files carry them to vLLM's multiprocess registry."""
    env = {**clean_env(), MULTIPROC_ENV: str(tmp_path)}
    for _ in range(2):
        python(WORKER, env)
    assert not list(tmp_path.glob("*.prom"))  # no export of our own in this mode
    code = """
    import sys
    from prometheus_client import generate_latest
    from vllm.v1.metrics.prometheus import get_prometheus_registry
    sys.stdout.write(generate_latest(get_prometheus_registry()).decode())
    """
    values = samples(python(code, env).stdout)
    check_totals(values, workers=2)
