"""Evidence code of vllm-gdn-invariant: the harness (vLLM's GDN layer outside an engine, the
provider agreement, the shadow checker's cases) and the end-to-end tools (negative-control
plugins, determinism cases, engine benchmarks).

For the scripts (``scripts/``, which put the checkout on ``sys.path``) and the tests (run from
the checkout). It is not in the wheel: ``pip install vllm-gdn-invariant`` installs
``vllm_gdn_invariant`` alone, and nothing in that package imports this one.
"""
