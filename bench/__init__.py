"""Benchmark scripts (run them directly; they print numbers, they are not tests)."""
