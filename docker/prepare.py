"""Build what a service needs before it serves, so nothing is generated or downloaded while clients wait.

* ``prepare.py env ENV_ID KWARGS_JSON`` — construct the env once (ALFWorld: generate or rebuild its games;
  WebShop: generate the catalog and build the search index), cached under ``$PROGPO_CACHE``;
* ``prepare.py webshop NUM_PRODUCTS SEED`` — the WebShop site's catalog and index.

Run at image build (the cache volume starts from the image's copy) and again at every start (a no-op when
cached). Nothing here touches the network.
"""

from __future__ import annotations

import json
import sys
import time


def main(argv: list[str]) -> int:
    started = time.perf_counter()
    if len(argv) == 3 and argv[0] == "env":
        import gymnasium as gym

        import progpo_envs  # noqa: F401  (registers the ids)

        env_id, kwargs = argv[1], json.loads(argv[2])
        gym.make(env_id, **kwargs).close()
        what = env_id
    elif len(argv) == 3 and argv[0] == "webshop":
        from webshop_server.engine import WebShopEngine

        engine = WebShopEngine.shared(int(argv[1]), int(argv[2]))
        what = f"WebShop catalog ({engine.num_goals} goals)"
    else:
        print(
            "usage: prepare.py env ENV_ID KWARGS_JSON | prepare.py webshop NUM_PRODUCTS SEED", file=sys.stderr
        )
        return 2
    print(f"[prepare] {what} ready in {time.perf_counter() - started:.1f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
