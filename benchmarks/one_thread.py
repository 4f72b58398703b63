"""Import first, before numpy or torch load: benchmarks measure on one thread unless ``OMP_NUM_THREADS`` says
otherwise.

The BLAS and OpenMP thread pools read ``OMP_NUM_THREADS`` once, when they load, so the setting must precede
the first import of numpy or torch; a benchmark imports this module above an ``# isort: split`` line, and the
processes it starts (servers, ``progpo train`` runs) inherit the setting.
"""

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
