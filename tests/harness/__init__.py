"""CPU tests of the evidence harness (gdn_evidence.harness)."""
