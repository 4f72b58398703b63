"""Code the benchmarks share. No module here is a benchmark, and no benchmark imports another: what two of
them need lives here (or in :mod:`benchmarks.common`)."""
