"""Berth's benchmarks: `make bench` runs `bench.run` and writes bench/RESULTS.md."""
