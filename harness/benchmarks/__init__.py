"""Benchmarks per op: each module `<op>.py` defines `cases(device, shapes) -> list[harness.bench.BenchCase]`."""
