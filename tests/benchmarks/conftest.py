"""The benchmark tests measure on one thread, as the benchmarks do."""

import benchmarks.one_thread  # noqa: F401  (before numpy and torch load, as in the benchmarks)
