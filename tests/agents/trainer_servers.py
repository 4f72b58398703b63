"""The real envs the trainers' env classes are tested on (``test_agents_trl.py``,
``test_agents_trainer_clients.py``), and their servers on loopback."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from progpo_envs.server.app import ServerConfig, create_app
from progpo_envs.server.openenv_app import OpenEnvServer, create_openenv_app
from progpo_envs.server.pool import PoolConfig
from progpo_envs.server.serving import BackgroundServer

ALFWORLD, WEBSHOP = "progpo/ALFWorld-v0", "progpo/WebShop-v0"
SPLIT = {ALFWORLD: "train", WEBSHOP: "test"}
#: What the operator fixes on the servers, and what the in-process envs are made with.
ENV_KWARGS = {ALFWORLD: {}, WEBSHOP: {"num_products": 200}}


def start_server(env_id: str, protocol: str, env_kwargs: dict) -> OpenEnvServer | BackgroundServer:
    """A started server of ``env_id`` alone (one env worker, built with ``env_kwargs``) speaking ``protocol``
    (``openenv``, else our native API); ``stop()`` ends it."""
    config = ServerConfig(env_ids=(env_id,), env_kwargs={env_id: env_kwargs}, pool=PoolConfig(num_workers=1))
    if protocol == "openenv":
        return OpenEnvServer(create_openenv_app(config)).start()
    return BackgroundServer(create_app(config)).__enter__()


@contextlib.contextmanager
def servers_on_first_use(env_kwargs: Callable[[str], dict]) -> Iterator[Callable[[str, str], str]]:
    """``url(env_id, protocol)``: the URL of :func:`start_server`'s server for ``env_id`` (built with
    ``env_kwargs(env_id)``) and ``protocol``, started on first use; every server started is stopped at the
    end."""
    started: dict = {}

    def url(env_id: str, protocol: str) -> str:
        if (env_id, protocol) not in started:
            started[env_id, protocol] = start_server(env_id, protocol, env_kwargs(env_id))
        return started[env_id, protocol].url

    try:
        yield url
    finally:
        for server in started.values():
            server.stop()
