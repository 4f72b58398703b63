"""Train a tiny policy on ALFWorld with TRL alone: ``SFTTrainer`` on the expert's tool calls, then
``GRPOTrainer(environment_factory=...)`` against the OpenEnv server, held-out success before and after.

What it does, in order (docs/hosting.md, "Training with TRL", walks through it):

1. **The env.** ALFWorld as an OpenEnv server (``progpo serve --protocol openenv``; this script starts one in
   its own process unless ``--server`` names one), kept to the CPU quickstart's recipe
   (configs/quickstart.yaml): two task types in four small bedrooms, 160 generated training games, the
   searching expert on. The model plays it through :class:`agents.trl.ALFWorldToolEnv`: one tool,
   ``act(command)``.
2. **The warm start** (TRL's ``SFTTrainer``). The expert plays the 160 training tasks through the same tool
   env; each game becomes one conversation in TRL's Qwen2.5 tool template (the task, the assistant's
   ``act`` calls, the tool's answers) with the env class's ``tools``. A random-initialised model cannot read
   yet, so the loss covers the **whole conversation**, not only the assistant's calls: predicting the
   observations teaches it to copy the names it has seen (an admissible command is a copy of words in the
   prompt), and the calls are learnt on top (``--sft-assistant-epochs`` then trains the calls alone).
3. **Held-out success before GRPO**: episodes on generated ``valid_seen`` tasks (new tasks in the rooms it
   trains in), played with the model through the same tool env and TRL's own tool-call parsing
   (``trl.chat_template_utils.parse_response``), the way ``GRPOTrainer`` plays them: the same prompt, the same
   token budget (``--max-completion-length`` over all turns), the same number of tool calls, sampled at
   GRPO's temperature.
4. **GRPO** (TRL's ``GRPOTrainer`` with ``environment_factory``), the reward being the env's return
   (``get_reward``: 10 for a solved task).
5. **Held-out success after GRPO**, measured as before (the same tasks and sampling seeds).

It prints its progress and a result block, and writes ``<run-dir>/result.json``. No GPU and no download: the
model is the project's tiny random-initialised Qwen2 (``training.policy.build_tiny_policy``, Qwen2.5's
tokenizer cut to its first ``--vocab-size`` ids). ``benchmarks/bench_training.py trl`` runs it over 3 seeds.

**A pretrained model** (``--model``, a Hugging Face folder with a ChatML chat template, e.g. the SmolLM2-135M
that ``scripts/convert_smollm2.py`` makes) is fine-tuned instead of the tiny model, with what fine-tuning
wants: learning rates two to three orders of magnitude below the from-scratch ones (``--sft-lr`` 1e-5,
``--grpo-lr`` 1e-6 by default: the quickstart's rates are for weights that start random), gradient
checkpointing on, and SFT one conversation per forward pass (``--sft-micro-batch-size`` 1, the
``--sft-batch-size`` conversations of a step accumulated): the default batch of four whole conversations kept
every layer's activations and logits over SmolLM2's 49,152-token vocabulary and was killed at 17 GB (issue
39).

Run (from the repository root)::

    python examples/trl_alfworld.py --seed 0                     # starts the server itself
    python examples/trl_alfworld.py --seed 1 --warm-start runs/trl_alfworld/seed0/sft   # reuse a warm start
    python examples/trl_alfworld.py --model models/SmolLM2-135M-Instruct --threads 1   # fine-tune SmolLM2
    # against a server you started (the expert must be on: it is the operator's setting)
    progpo serve --protocol openenv --env progpo/ALFWorld-v0 --port 8010 --workers 2 --env-kwargs \\
      'progpo/ALFWorld-v0={"task_types": ["pick_and_place_simple", "look_at_obj_in_light"],
      "scenes": [304, 316, 328, 329], "num_generated": 160, "max_steps": 12, "expert": true,
      "expert_mode": "searching"}'
    python examples/trl_alfworld.py --server http://127.0.0.1:8010
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # environment_factory is marked experimental
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything is built locally

import torch  # noqa: E402
from datasets import Dataset  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback  # noqa: E402
from transformers.utils import get_json_schema  # noqa: E402
from trl import GRPOConfig, GRPOTrainer, SFTConfig, SFTTrainer  # noqa: E402
from trl.chat_template_utils import add_response_schema, parse_response, qwen2_5_chat_template  # noqa: E402

from agents.trl import ALFWorldToolEnv, expert_command, task_rows  # noqa: E402
from training.config import TinyModelConfig  # noqa: E402
from training.policy import build_tiny_policy  # noqa: E402

ENV_ID = "progpo/ALFWorld-v0"
#: The CPU quickstart's ALFWorld (configs/quickstart.yaml): two task types in four small bedrooms, 160
#: generated games per split, 12 commands per episode. The client asks for these on every reset.
ENV_KWARGS = {
    "task_types": ["pick_and_place_simple", "look_at_obj_in_light"],
    "scenes": [304, 316, 328, 329],
    "num_generated": 160,
    "max_steps": 12,
}
#: What only the server's operator may turn on: the searching expert's next command in every observation
#: (``expert_action``; the tool's text never shows it), which the warm start imitates.
OPERATOR_KWARGS = {"expert": True, "expert_mode": "searching"}
TRAIN_SPLIT, HELD_OUT_SPLIT = "train", "valid_seen"
#: Defaults that depend on where the weights start: random (the tiny model) or pretrained (``--model``).
FROM_SCRATCH = {"sft_lr": 3e-3, "grpo_lr": 3e-4, "gradient_checkpointing": False}
FINE_TUNING = {"sft_lr": 1e-5, "grpo_lr": 1e-6, "gradient_checkpointing": True}


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


# --- 1. the env --------------------------------------------------------------------------------------------
def start_server(workers: int = 2):
    """The ALFWorld OpenEnv server in this process (its env workers are their own processes), with the
    quickstart's env and the expert fixed by the operator; ``.url`` to connect, ``.stop()`` at the end."""
    from progpo_envs.server.app import ServerConfig
    from progpo_envs.server.openenv_app import OpenEnvServer, create_openenv_app
    from progpo_envs.server.pool import PoolConfig

    config = ServerConfig(
        env_ids=(ENV_ID,),
        env_kwargs={ENV_ID: {**ENV_KWARGS, **OPERATOR_KWARGS}},
        pool=PoolConfig(num_workers=workers),
    )
    return OpenEnvServer(create_openenv_app(config)).start()


def env_factory(url: str):
    """What ``GRPOTrainer(environment_factory=...)`` calls for each rollout: a tool env on the server."""

    def make_env() -> ALFWorldToolEnv:
        return ALFWorldToolEnv(server=url, **ENV_KWARGS)  # protocol="openenv"

    return make_env


def tool_schemas(env: ALFWorldToolEnv) -> list[dict]:
    """The tools as ``GRPOTrainer`` renders them: the env's public methods, their schemas from docstrings."""
    return [get_json_schema(env.act)]


# --- 2. the warm start -------------------------------------------------------------------------------------
def expert_conversations(make_env, rows: list[dict]) -> tuple[list[dict], dict]:
    """The expert's play of each row as one conversation of TRL's tool format (only the games it won):
    ``{"messages": [user: instruction + first observation, assistant: act(...), tool: answer, ...],
    "tools": <the schema, as JSON>}``. The user message is what ``GRPOTrainer`` puts in the prompt."""
    env = make_env()
    tools = json.dumps(tool_schemas(env))
    conversations, won, steps = [], 0, 0
    for row in rows:
        first = env.reset(**row)
        prompt = row["prompt"]
        messages = [*prompt[:-1], {**prompt[-1], "content": prompt[-1]["content"] + first}]
        while not env.done:
            try:
                command = expert_command(env)
            except RuntimeError as exc:
                raise SystemExit(
                    f"the server has no expert ({exc}): start it with the expert on "
                    '(--env-kwargs \'progpo/ALFWorld-v0={"expert": true, "expert_mode": "searching", ...}\')'
                ) from None
            call = {"type": "function", "function": {"name": "act", "arguments": {"command": command}}}
            messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
            messages.append({"role": "tool", "name": "act", "content": env.act(command)})
            steps += 1
        if env.get_reward() > 0:
            won += 1
            conversations.append({"messages": messages, "tools": tools})
    return conversations, {"demo_episodes": len(rows), "demo_won": won, "demo_steps": steps}


def warm_start(folder: Path, conversations: list[dict], args, out: Path) -> dict:
    """TRL's ``SFTTrainer`` on the expert's conversations, loss on every token (then, with
    ``--sft-assistant-epochs``, on the assistant's calls alone); the model is saved to ``out``. Each step
    takes ``--sft-batch-size`` conversations, ``--sft-micro-batch-size`` per forward pass (the rest
    accumulated)."""
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.chat_template = qwen2_5_chat_template  # TRL's Qwen2.5 template, with tool calls
    model = AutoModelForCausalLM.from_pretrained(folder)
    dataset = Dataset.from_list(conversations)
    stats: dict = {"sft_conversations": len(conversations)}
    stages = [
        ("whole conversation", args.sft_epochs, False),
        ("assistant only", args.sft_assistant_epochs, True),
    ]
    for name, epochs, assistant_only in stages:
        if epochs <= 0:
            continue
        config = SFTConfig(
            output_dir=str(out / "trainer"),
            num_train_epochs=epochs,
            per_device_train_batch_size=args.sft_micro_batch_size,
            gradient_accumulation_steps=args.sft_batch_size // args.sft_micro_batch_size,
            learning_rate=args.sft_lr,
            lr_scheduler_type="linear",
            warmup_steps=0.05,
            weight_decay=0.0,
            max_length=None,  # whole conversations (the longest is ~2,000 tokens)
            train_sampling_strategy="group_by_length",  # batches of similar lengths: less padding
            assistant_only_loss=assistant_only,
            logging_steps=1,  # a loss per step: the curve of a short warm start too
            save_strategy="no",
            report_to="none",
            use_cpu=True,
            bf16=False,  # TRL's default; a CPU without bf16 kernels emulates it several times slower
            gradient_checkpointing=args.gradient_checkpointing,  # off for the tiny model: time for no need
            seed=args.seed,
            data_seed=args.seed,
            dataloader_num_workers=0,
            disable_tqdm=True,
        )
        trainer = SFTTrainer(
            model=model,
            args=config,
            train_dataset=dataset,
            processing_class=tokenizer,
            callbacks=[Progress(f"SFT ({name})")],
        )
        started = time.perf_counter()
        trainer.train()
        losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry] or [float("nan")]
        key = "sft_assistant" if assistant_only else "sft"
        stats.update(
            {
                f"{key}_epochs": epochs,
                f"{key}_steps": trainer.state.global_step,
                f"{key}_loss_first": losses[0],
                f"{key}_loss_last": losses[-1],
                f"{key}_losses": losses,
                f"{key}_seconds": time.perf_counter() - started,
            }
        )
        model = trainer.model
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return stats


class Progress(TrainerCallback):
    """One line per logging step of a TRL trainer."""

    KEYS = ("loss", "mean_token_accuracy", "reward", "tools/call_frequency", "learning_rate")

    def __init__(self, what: str):
        self.what, self.started = what, time.perf_counter()

    def on_log(self, args, state, control, logs=None, **kwargs):
        shown = ", ".join(f"{k} {logs[k]:.4g}" for k in self.KEYS if logs and k in logs)
        elapsed = time.perf_counter() - self.started
        log(f"{self.what} step {state.global_step}/{state.max_steps}: {shown} ({elapsed:.0f} s)")


# --- 3. and 5. held-out success ---------------------------------------------------------------------------
def tool_suffix_ids(tokenizer, tool_messages: list[dict]) -> list[int]:
    """The tokens the template puts after an assistant's ``<|im_end|>`` for these tool answers, up to the next
    assistant header: what ``GRPOTrainer`` appends between turns (the same dummy-conversation difference)."""
    call = [{"type": "function", "function": {"name": tool_messages[0]["name"], "arguments": {}}}]
    dummy = [{"role": "user", "content": "dummy"}, {"role": "assistant", "content": "", "tool_calls": call}]
    prefix = tokenizer.apply_chat_template(dummy, tokenize=True, return_dict=False)
    full = tokenizer.apply_chat_template(
        dummy + tool_messages, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    end = max(i for i, t in enumerate(prefix) if t == tokenizer.eos_token_id)
    return full[end + 1 :]


@torch.no_grad()
def play(model, tokenizer, make_env, rows: list[dict], args, seed: int) -> list[dict]:
    """Play one episode per row with ``model`` as ``GRPOTrainer`` does: the row's prompt plus the reset's
    observation in the chat template with the tools, then generate, parse the tool calls with TRL's
    ``parse_response``, call them, append the template's tool turn and generate again, until the model calls
    no tool, ``--max-tool-calls`` calls were made or ``--max-completion-length`` tokens (every turn, tool
    answers included) are spent. Episodes run batched; sampling at ``--temperature`` (0: greedy) from
    ``seed``. Returns per episode: won, tool calls, well-formed ``act`` calls, admissible commands, completion
    tokens."""
    model.eval()
    envs = [make_env() for _ in rows]
    tools = [envs[0].act]
    prompts, episodes = [], []
    for env, row in zip(envs, rows, strict=True):
        first = env.reset(**row)
        prompt = row["prompt"]
        messages = [*prompt[:-1], {**prompt[-1], "content": prompt[-1]["content"] + first}]
        prompts.append(
            tokenizer.apply_chat_template(
                messages, tools=tools, add_generation_prompt=True, tokenize=True, return_dict=False
            )
        )
        episodes.append({"task_index": row["task_index"], "calls": 0, "well_formed": 0, "admissible": 0})
    sequences = [list(p) for p in prompts]
    torch.manual_seed(seed)
    active = list(range(len(rows)))
    for turn in range(args.max_tool_calls + 1):
        if not active:
            break
        outputs = generate(model, tokenizer, [sequences[i] for i in active], args)
        still = []
        for i, output in zip(active, outputs, strict=True):
            budget = args.max_completion_length - (len(sequences[i]) - len(prompts[i]))
            output = output[: max(budget, 0)]
            parsed = parse_response(tokenizer, output, prefix=sequences[i], tools=tools) if output else {}
            sequences[i] += output
            calls = parsed.get("tool_calls") or []
            if not calls or turn == args.max_tool_calls:
                continue
            answers = []
            for call in calls:
                episodes[i]["calls"] += 1
                function = call.get("function", {})
                command = function.get("arguments", {}).get("command")
                if function.get("name") == "act" and isinstance(command, str):
                    episodes[i]["well_formed"] += 1
                    episodes[i]["admissible"] += command in envs[i].last_view.get("admissible_actions", ())
                try:  # what GRPOTrainer does with a call: the result, or the error as the tool's answer
                    if function.get("name") != "act":
                        raise ValueError(f"Tool {function.get('name')} not found.")
                    answer = envs[i].act(**function["arguments"])
                except Exception as exc:  # noqa: BLE001 - the model hears any failure, as in TRL
                    answer = {"error": str(exc)}
                answers.append({"role": "tool", "name": function.get("name", "act"), "content": str(answer)})
            suffix = tool_suffix_ids(tokenizer, answers)
            if len(sequences[i]) + len(suffix) - len(prompts[i]) > args.max_completion_length:
                continue  # GRPOTrainer drops a tool answer that would not fit, and the episode ends
            sequences[i] += suffix
            still.append(i)
        active = still
    for episode, env, prompt, sequence in zip(episodes, envs, prompts, sequences, strict=True):
        episode.update(won=env.get_reward() > 0, completion_tokens=len(sequence) - len(prompt))
    return episodes


def generate(model, tokenizer, batch: list[list[int]], args) -> list[list[int]]:
    """One turn for every sequence of ``batch`` (left-padded), each cut after its first end-of-turn token, as
    ``GRPOTrainer``'s transformers path does; at most ``--max-new-tokens`` per turn."""
    width = max(len(s) for s in batch)
    pad = tokenizer.pad_token_id
    input_ids = torch.tensor([[pad] * (width - len(s)) + s for s in batch])
    attention_mask = torch.tensor([[0] * (width - len(s)) + [1] * len(s) for s in batch])
    sampling = {"do_sample": True, "temperature": args.temperature, "top_k": 0, "top_p": 1.0}
    output = model.generate(
        input_ids=input_ids,
        attention_mask=attention_mask,
        max_new_tokens=args.max_new_tokens,
        pad_token_id=pad,
        eos_token_id=tokenizer.eos_token_id,
        **(sampling if args.temperature > 0 else {"do_sample": False}),
    )[:, width:].tolist()
    cut = []
    for ids in output:
        end = ids.index(tokenizer.eos_token_id) + 1 if tokenizer.eos_token_id in ids else len(ids)
        cut.append(ids[:end])
    return cut


def evaluate(model, tokenizer, make_env, rows: list[dict], args, what: str) -> dict:
    """Held-out success: every row once per sampling seed; mean, spread (population std over the sampling
    seeds) and what the calls looked like."""
    started = time.perf_counter()
    per_seed, episodes = [], []
    for k in range(args.eval_seeds):
        played = play(model, tokenizer, make_env, rows, args, seed=1000 * args.seed + k)
        per_seed.append(sum(e["won"] for e in played) / len(played))
        episodes += played
    calls = sum(e["calls"] for e in episodes)
    mean = sum(per_seed) / len(per_seed)
    result = {
        "success": mean,
        "spread": math.sqrt(sum((s - mean) ** 2 for s in per_seed) / len(per_seed)),
        "per_sampling_seed": per_seed,
        "episodes": len(episodes),
        "tool_calls_per_episode": calls / len(episodes),
        "well_formed_calls": sum(e["well_formed"] for e in episodes) / max(calls, 1),
        "admissible_calls": sum(e["admissible"] for e in episodes) / max(calls, 1),
        "completion_tokens": sum(e["completion_tokens"] for e in episodes) / len(episodes),
        "seconds": time.perf_counter() - started,
    }
    log(
        f"{what}: success {mean:.1%} ± {result['spread']:.1%} on {len(rows)} held-out tasks × "
        f"{args.eval_seeds} sampling seeds; {result['tool_calls_per_episode']:.1f} calls/episode, "
        f"{result['admissible_calls']:.0%} admissible ({result['seconds']:.0f} s)"
    )
    return result


# --- 4. GRPO -----------------------------------------------------------------------------------------------
def grpo(model, tokenizer, make_env, rows: list[dict], args, out: Path) -> tuple[torch.nn.Module, dict]:
    """TRL's ``GRPOTrainer`` on the training tasks against the server; the env's return is the reward."""
    config = GRPOConfig(
        output_dir=str(out / "trainer"),
        max_steps=args.grpo_steps,
        per_device_train_batch_size=args.grpo_prompts * args.num_generations,  # completions per step
        num_generations=args.num_generations,
        learning_rate=args.grpo_lr,
        lr_scheduler_type="constant",
        beta=args.beta,
        temperature=args.temperature,
        max_completion_length=args.max_completion_length,
        max_tool_calling_iterations=args.max_tool_calls,
        generation_kwargs={"max_new_tokens": args.max_new_tokens},  # per turn (a call is ~25 tokens)
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        bf16=False,
        gradient_checkpointing=args.gradient_checkpointing,
        seed=args.seed,
        data_seed=args.seed,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    trainer = GRPOTrainer(
        model=model,
        processing_class=tokenizer,
        args=config,
        train_dataset=Dataset.from_list(rows),
        environment_factory=make_env,
        callbacks=[Progress("GRPO")],
    )
    started = time.perf_counter()
    trainer.train()
    logged = [entry for entry in trainer.state.log_history if "reward" in entry]
    return trainer.model, {
        "grpo_steps": trainer.state.global_step,
        "grpo_seconds": time.perf_counter() - started,
        "grpo_reward": [entry["reward"] for entry in logged],
        "grpo_loss": [entry.get("loss") for entry in logged],
        "grpo_tool_calls": [entry.get("tools/call_frequency") for entry in logged],
        "grpo_env_reward": [entry.get("rewards/ALFWorldToolEnv/mean") for entry in logged],
    }


# --- the run -----------------------------------------------------------------------------------------------
def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("--seed", type=int, default=0, help="seed of SFT, GRPO and the evaluation's sampling")
    add("--server", default=None, help="URL of a running ALFWorld OpenEnv server (default: start one)")
    add("--server-workers", type=int, default=2, help="env worker processes of the server started here")
    add("--run-dir", default=None, help="where the run writes (default: runs/trl_alfworld/seed<seed>)")
    add("--warm-start", default=None, help="a folder saved by an earlier run's SFT (<run-dir>/sft): skip SFT")
    add(
        "--model",
        default=None,
        help="a pretrained causal LM folder to fine-tune (default: build the tiny model, train from scratch)",
    )
    add("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    add("--vocab-size", type=int, default=4096, help="BPE ids the tiny model keeps from Qwen2.5's tokenizer")
    add("--layers", type=int, default=2, help="transformer layers of the tiny model")
    add("--hidden-size", type=int, default=128, help="hidden size of the tiny model")
    add("--sft-tasks", type=int, default=160, help="training tasks the expert plays for SFT")
    add("--sft-epochs", type=float, default=6, help="SFT epochs with the loss on the whole conversation")
    add(
        "--sft-assistant-epochs", type=float, default=0, help="then SFT epochs on the assistant's calls alone"
    )
    add(
        "--sft-lr",
        type=float,
        default=None,
        help="SFT learning rate, linear decay (default: 3e-3 from scratch, 1e-5 fine-tuning a --model)",
    )
    add("--sft-batch-size", type=int, default=4, help="conversations per SFT step")
    add(
        "--sft-micro-batch-size",
        type=int,
        default=None,
        help="conversations per SFT forward pass, the step's others accumulated (default: the whole "
        "--sft-batch-size from scratch, 1 fine-tuning a --model)",
    )
    add(
        "--gradient-checkpointing",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="recompute activations in the backward pass (default: on fine-tuning a --model, else off)",
    )
    add("--eval-tasks", type=int, default=32, help="held-out (valid_seen) tasks, spread over the split")
    add("--eval-seeds", type=int, default=2, help="sampling seeds per evaluation")
    add("--grpo-steps", type=int, default=40, help="GRPO optimisation steps")
    add(
        "--grpo-prompts",
        type=int,
        default=2,
        help="tasks per GRPO step (each played --num-generations times)",
    )
    add("--num-generations", type=int, default=4, help="GRPO group size")
    add(
        "--grpo-lr",
        type=float,
        default=None,
        help="GRPO learning rate, constant (default: 3e-4 from scratch, 1e-6 fine-tuning a --model)",
    )
    add("--beta", type=float, default=0.0, help="GRPO's KL coefficient")
    add("--temperature", type=float, default=1.0, help="sampling temperature of GRPO and the evaluation")
    add("--max-completion-length", type=int, default=2048, help="tokens of all turns of an episode")
    add(
        "--max-tool-calls",
        type=int,
        default=12,
        help="tool calls per episode (GRPO's max_tool_calling_iterations)",
    )
    add("--max-new-tokens", type=int, default=48, help="tokens per turn")
    args = parser.parse_args(argv)
    pretrained = args.model is not None
    if args.model is not None and args.warm_start is not None:
        parser.error("--model and --warm-start both name the starting weights: give one")
    if pretrained and not (Path(args.model) / "config.json").is_file():
        parser.error(f"--model {args.model}: no config.json there (a folder written by save_pretrained)")
    defaults = FINE_TUNING if pretrained else FROM_SCRATCH
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.sft_micro_batch_size is None:
        args.sft_micro_batch_size = 1 if pretrained else args.sft_batch_size
    if args.sft_micro_batch_size < 1 or args.sft_batch_size % args.sft_micro_batch_size:
        parser.error(
            f"--sft-micro-batch-size {args.sft_micro_batch_size} must divide "
            f"--sft-batch-size {args.sft_batch_size}"
        )
    return args


def tiny_shape(args) -> TinyModelConfig:
    """The tiny model's shape, from ``--vocab-size``, ``--layers`` and ``--hidden-size``."""
    return TinyModelConfig(
        vocab_size=args.vocab_size,
        hidden_size=args.hidden_size,
        intermediate_size=3 * args.hidden_size,
        num_hidden_layers=args.layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        seed=args.seed,
    )


def held_out_rows(make_env, count: int, seed: int = 0) -> list[dict]:
    """``count`` valid_seen tasks spread over the split (it holds every task type)."""
    all_rows = list(task_rows(make_env(), HELD_OUT_SPLIT, seed=seed))
    return [all_rows[int(i * len(all_rows) / count)] for i in range(min(count, len(all_rows)))]


def main(argv=None) -> dict:
    args = parse_args(argv)
    run_dir = Path(args.run_dir or f"runs/trl_alfworld/seed{args.seed}")
    run_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(args.seed)
    if args.threads:
        torch.set_num_threads(args.threads)
    started = time.perf_counter()
    server = None
    if args.server is None:
        server = start_server(args.server_workers)
        log(f"ALFWorld OpenEnv server at {server.url} ({args.server_workers} env workers)")
    url = args.server or server.url
    make_env = env_factory(url)
    result: dict = {"settings": vars(args), "env_kwargs": ENV_KWARGS, "command": " ".join(sys.argv)}
    try:
        train = list(task_rows(make_env(), TRAIN_SPLIT, seed=0))
        held_out = held_out_rows(make_env, args.eval_tasks)
        result["held_out_tasks"] = [row["task_index"] for row in held_out]

        if args.warm_start:
            sft_folder = Path(args.warm_start)
            result["warm_start_from"] = str(sft_folder)
            log(f"warm start: loading {sft_folder}")
        else:
            folder = (
                Path(args.model)
                if args.model
                else build_tiny_policy(run_dir / "tiny_policy", tiny_shape(args))
            )
            log(f"the expert plays {args.sft_tasks} training tasks through the tool env")
            conversations, demo = expert_conversations(make_env, train[: args.sft_tasks])
            log(
                f"{demo['demo_won']}/{demo['demo_episodes']} won, {demo['demo_steps']} tool calls; SFT of "
                f"{folder} starts"
            )
            sft_folder = run_dir / "sft"
            result["sft"] = {**demo, **warm_start(folder, conversations, args, sft_folder)}
        tokenizer = AutoTokenizer.from_pretrained(sft_folder)
        tokenizer.chat_template = qwen2_5_chat_template
        add_response_schema(tokenizer)  # how TRL's parse_response reads a Qwen2.5 tool call
        model = AutoModelForCausalLM.from_pretrained(sft_folder)

        result["before"] = evaluate(model, tokenizer, make_env, held_out, args, "held-out before GRPO")
        if args.grpo_steps > 0:
            model, result["grpo"] = grpo(model, tokenizer, make_env, train, args, run_dir / "grpo")
            result["after"] = evaluate(model, tokenizer, make_env, held_out, args, "held-out after GRPO")
    finally:
        if server is not None:
            server.stop()
    result["seconds"] = time.perf_counter() - started
    (run_dir / "result.json").write_text(json.dumps(result, indent=2) + "\n")
    if "after" not in result:
        return result
    before, after = result["before"], result["after"]
    print(
        "\n".join(
            [
                "",
                f"=== TRL on ALFWorld, seed {args.seed} ({result['seconds'] / 60:.1f} min) ===",
                f"held-out success ({len(held_out)} valid_seen tasks × {args.eval_seeds} sampling seeds, "
                f"temperature {args.temperature}):",
                f"  after SFT (before GRPO): {before['success']:.1%} ± {before['spread']:.1%}",
                f"  after {result['grpo']['grpo_steps']} GRPO steps:     "
                f"{after['success']:.1%} ± {after['spread']:.1%}",
                f"result: {run_dir / 'result.json'}",
            ]
        ),
        flush=True,
    )
    return result


if __name__ == "__main__":
    main()
