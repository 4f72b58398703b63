"""Code the benchmarks share. No module here is a benchmark, and no suite imports another: what two of them
need lives here (or in :mod:`benchmarks.common` and :mod:`benchmarks.harness`)."""
