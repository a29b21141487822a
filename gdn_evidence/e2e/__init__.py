"""End-to-end evidence in a real vLLM engine: plugin loading for unpacked trees, negative
controls, the determinism cases (``scripts/e2e_determinism.py``) and the engine benchmark
(``scripts/bench_engine.py``)."""
