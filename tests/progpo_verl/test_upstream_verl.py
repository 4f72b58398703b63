"""Our package against upstream verl 0.9.1 (PyPI's), in ``.venv-verl`` (``.ci/run_verl``): the
``verl.plugins`` entry point loads on ``import verl``, verl's ``compute_advantage`` passes a registered
estimator exactly the arguments :mod:`progpo_verl.upstream` says (so a step-level estimator cannot run there
yet), and ``install()`` refuses a verl that is not verl-agent."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.verl

verl = pytest.importorskip("verl")
if verl.__version__ != "0.9.1":
    pytest.skip(f"these checks are for verl 0.9.1, this is {verl.__version__}", allow_module_level=True)

from progpo_verl.upstream import UPSTREAM_KWARGS, StepRowsNeeded  # noqa: E402
from progpo_verl.verl_agent.contract import ContractError  # noqa: E402
from progpo_verl.verl_agent.install import install  # noqa: E402
from progpo_verl.verl_agent.settings import adv_estimator_names  # noqa: E402

RAY_TRAINER = Path(verl.__file__).parent / "trainer" / "ppo" / "ray_trainer.py"
PROBE = """
import json, sys
import verl
from verl.trainer.ppo import core_algos
print(json.dumps({"loaded": "progpo_verl.upstream" in sys.modules,
                  "registered": sorted(core_algos.ADV_ESTIMATOR_REGISTRY)}))
"""


def probe(cwd: Path, **env: str) -> dict:
    """``import verl`` in a fresh interpreter, away from the checkout (whose egg-info could shadow the
    installed metadata): whether our module was loaded, and what verl's registry holds."""
    out = subprocess.run(
        [sys.executable, "-c", PROBE],
        env={**os.environ, **env},
        cwd=cwd,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_import_verl_loads_our_entry_point(tmp_path):
    loaded = probe(tmp_path)
    assert loaded["loaded"] and set(adv_estimator_names()) <= set(loaded["registered"])
    disabled = probe(
        tmp_path, VERL_USE_EXTERNAL_PLUGINS="none"
    )  # verl's switch for entry points: it is theirs loading us
    assert not disabled["loaded"] and not set(adv_estimator_names()) & set(disabled["registered"])


def adv_kwargs_assignments() -> list[tuple[str, str]]:
    """``(keyword, condition)`` for every argument ``compute_advantage`` gives a registered estimator: the
    keys of its ``adv_kwargs`` dict and each later ``adv_kwargs[key] = ...`` with the ``if`` tests around
    it."""
    tree = ast.parse(RAY_TRAINER.read_text(encoding="utf-8"))
    function = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "compute_advantage")
    found = []

    def walk(node: ast.AST, conditions: tuple[str, ...]) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If):
                for statement in child.body:
                    walk_statement(statement, (*conditions, ast.unparse(child.test)))
                for statement in child.orelse:
                    walk_statement(statement, (*conditions, f"not ({ast.unparse(child.test)})"))
            else:
                walk_statement(child, conditions)

    def walk_statement(node: ast.AST, conditions: tuple[str, ...]) -> None:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if (
                isinstance(target, ast.Name)
                and target.id == "adv_kwargs"
                and isinstance(node.value, ast.Dict)
            ):
                found.extend((ast.literal_eval(k), " and ".join(conditions)) for k in node.value.keys)
            elif isinstance(target, ast.Subscript) and ast.unparse(target.value) == "adv_kwargs":
                found.append((ast.literal_eval(target.slice), " and ".join(conditions)))
        if isinstance(node, ast.If):
            walk(ast.Module(body=[node], type_ignores=[]), conditions)
        elif not isinstance(node, ast.Assign):
            walk(node, conditions)

    walk(function, ())
    return found


def test_verl_passes_a_registered_estimator_no_step_rows():
    """Outside the estimators verl special-cases by name (GDPO's raw batch, the optimal-token baselines),
    an estimator gets exactly UPSTREAM_KWARGS: nothing that identifies a trajectory or a step."""
    assignments = adv_kwargs_assignments()
    assert assignments, f"no adv_kwargs in {RAY_TRAINER}: verl's compute_advantage changed"

    def by_name(condition: str) -> bool:
        return any(tag in condition for tag in ("GDPO", "gdpo", "OPTIMAL_TOKEN_BASELINE"))

    generic = {key for key, condition in assignments if not by_name(condition)}
    assert generic == set(UPSTREAM_KWARGS)
    assert {key for key, condition in assignments if key in ("non_tensor_batch", "batch")} <= {
        key for key, condition in assignments if "GDPO" in condition
    }


def test_our_names_answer_verls_arguments_with_the_way_that_works():
    import torch
    from verl.trainer.ppo import core_algos

    kwargs = {
        "token_level_rewards": torch.zeros(4, 3),
        "response_mask": torch.ones(4, 3),
        "config": None,
        "index": ["a", "a", "b", "b"],
    }
    for name in adv_estimator_names():
        with pytest.raises(
            StepRowsNeeded, match=r"passed only \['config', 'index', 'response_mask'"
        ) as error:
            core_algos.get_adv_estimator_fn(name)(**kwargs)
        assert f"python -m progpo_verl.verl_agent algorithm.adv_estimator={name}" in str(error.value)


def test_install_refuses_a_verl_that_is_not_verl_agent():
    with pytest.raises(ContractError, match="no verl-agent here"):
        install()
