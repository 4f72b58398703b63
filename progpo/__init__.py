"""The ``progpo`` command (:mod:`progpo.cli`): the one module that names every package's command line, above
all the layers of ``docs/architecture.md``."""
