"""What every layer may import: how a command line reads its config and reports its mistakes, and how a
server reads a request's body.

* :mod:`progpo_base.usage`: one-line usage and start-up errors (exit status 2), help with defaults;
* :mod:`progpo_base.config`: dataclass configs with documented fields, YAML files, dotted overrides, generated
  ``--help-config`` and short flags (``progpo train`` and ``progpo eval``);
* :mod:`progpo_base.http`: a request body as a bounded JSON object and the client error with its HTTP status
  (the shop's session API and the env server);
* :mod:`progpo_base.glibc`: glibc's functions for a long-lived process's memory (the servers' malloc arenas
  and heap trims, an ALFWorld worker's idle planner copies).

It sits below every layer of ``docs/architecture.md`` and imports nothing else from the project.
"""
