"""Benchmarks: `python -m benchmarks [NAME ...] [-- ARGS]`; each module here has `main(argv) -> int`."""
