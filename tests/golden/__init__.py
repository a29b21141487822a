"""CPU tests of the goldens (vllm_gdn_invariant.golden)."""
