"""Golden case definitions, one module per op family (see harness.golden)."""
