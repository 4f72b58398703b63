"""Per-copy infos from a Gymnasium vector env (the harness and the training loop both need them).

Example:
    >>> import numpy as np
    >>> info = {"won": np.array([True, False]), "_won": np.array([True, True]),
    ...         "expert_action": np.array(["look", None], dtype=object),
    ...         "_expert_action": np.array([True, False])}
    >>> unbatch_info(info, 2)
    [{'won': True, 'expert_action': 'look'}, {'won': False}]
"""

from __future__ import annotations

from typing import Any

import numpy as np


def unbatch_info(info: dict[str, Any], num_envs: int) -> list[dict[str, Any]]:
    """Gymnasium's vector ``info`` (dict of arrays with ``_key`` masks, nested dicts) → one dict per copy.

    Values become plain Python values (``ndarray.tolist``; 64-bit keys become ``int``).
    """
    out: list[dict[str, Any]] = [{} for _ in range(num_envs)]
    for key, value in info.items():
        if key[:1] == "_":
            continue
        if isinstance(value, dict):
            for i, sub in enumerate(unbatch_info(value, num_envs)):
                if sub:
                    out[i][key] = sub
            continue
        values = value.tolist() if isinstance(value, np.ndarray) else list(value)
        mask = info.get("_" + key)
        present = [True] * num_envs if mask is None else mask.tolist()
        for i in range(num_envs):
            if present[i]:
                out[i][key] = values[i]
    return out
