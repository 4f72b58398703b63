"""Hosting the envs over HTTP: the env server, its remote Gymnasium client, and AgentGym's protocol.

* :mod:`~progpo_envs.server.app` — the Flask app (``create_app``) and its routes;
* :mod:`~progpo_envs.server.native` — the native API's calls, once for both its doors (routes, stream);
* :mod:`~progpo_envs.server.stream` — the stream door: the calls as WebSocket messages (``GET /stream``);
* :mod:`~progpo_envs.server.websocket` — RFC 6455 frames and a client connection (the door's, its client's);
* :mod:`~progpo_envs.server.pool` — instances in worker subprocesses (ids, expiry, limits, fault isolation);
* :mod:`~progpo_envs.server.pool_worker` — one worker subprocess: its instances, each message's reply, ``seq``
  replays;
* :mod:`~progpo_envs.server.policy` — which envs and constructor kwargs a client may ask for;
* :mod:`~progpo_envs.server.codec` — exact JSON for infos (numpy keys, int-keyed dicts, tuples);
* :mod:`~progpo_envs.server.request_args` — the JSON body and validated reset/step arguments of a request;
* :mod:`~progpo_envs.server.remote` — ``progpo/Remote-v0``, the client env, and batched stepping;
* :mod:`~progpo_envs.server.fleet` — ``progpo/Remote-v0`` over several servers (groups placed by load, a lost
  server's groups made again on the others, each server's share);
* :mod:`~progpo_envs.server.agentgym` — AgentGym's ``/create``, ``/reset``, ``/step``, ... routes;
* :mod:`~progpo_envs.server.openenv_app`, :mod:`~progpo_envs.server.openenv_session` and
  :mod:`~progpo_envs.server.openenv_models` — one env as an OpenEnv environment (OpenEnv's own server, the
  episodes in the pool; ``progpo serve --protocol openenv``);
* :mod:`~progpo_envs.server.serving` and :mod:`~progpo_envs.server.cli` — waitress, ``progpo serve``.

Nothing is imported here, so ``import progpo_envs.server.remote`` does not pull in Flask.
"""
