"""The verl-agent plugin: our estimators as its advantage estimators, our envs as its env package.

* :mod:`~progpo_verl.verl_agent.contract` — the verl-agent functions the plugin wraps, with their parameters;
* :mod:`~progpo_verl.verl_agent.settings` — verl-agent's config read into our checked specs;
* :mod:`~progpo_verl.verl_agent.envs` — our group vector envs behind verl-agent's env-manager interface;
* :mod:`~progpo_verl.verl_agent.install` — ``install()``, run in every Ray worker by a setup hook;
* ``python -m progpo_verl.verl_agent`` — the launcher (``__main__``); ``recipes/`` — the papers' settings.

Only ``install()`` (when it runs) and the launcher import verl-agent; ``docs/verl_agent.md`` is the guide.
"""
