"""Our estimators and envs inside other RL trainers, starting with verl-agent (``docs/verl_agent.md``).

* :mod:`progpo_verl.rows` — a verl-agent batch as step rows for :mod:`training.advantages`, and per-row
  advantages as verl's token-level ones (no verl import);
* :mod:`progpo_verl.estimator` — an estimator of ours with validated parameters, applied to a batch;
* :mod:`progpo_verl.verl_agent` — the verl-agent plugin: ``install()`` (run in every Ray worker by a setup
  hook), our envs as a verl-agent env package, and the launcher ``python -m progpo_verl.verl_agent``;
* :mod:`progpo_verl.upstream` — the ``verl.plugins`` entry point that upstream verl (>= 0.9) loads.

Nothing here depends on the ``verl`` distribution: verl-agent installs itself under that name, so the
modules that talk to it import it only where they run inside it.
"""
