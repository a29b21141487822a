"""CPU tests of the evidence harness (vllm_gdn_invariant.harness)."""
