#!/usr/bin/env bash
# WebShop, Qwen2.5-1.5B-Instruct on 2 GPUs: the GiGPO paper's setting, as verl-agent's
# examples/gigpo_trainer/run_webshop.sh runs it (16 task groups x 8 rollouts, <= 15 steps, 150 epochs,
# gamma 0.95, lr 1e-6, KL loss 0.01, invalid-action penalty 0.1), with our estimator and our WebShop env
# (in-process on the self-hosted catalog; env.progpo.kwargs pass its options, e.g. a shop server url).
#
#   VERL_AGENT_DIR=~/verl-agent bash progpo_verl/verl_agent/recipes/run_webshop.sh [vllm|sglang] [OVERRIDE...]
#
#   ESTIMATOR, VERL_AGENT_DIR: see gigpo_setting.sh (the settings both recipes share)
# Extra arguments are Hydra overrides, after these (e.g. trainer.logger=['console']).
set -euo pipefail
ulimit -u 65536 2>/dev/null || true  # as verl-agent's WebShop script
ENGINE=${1:-vllm}
shift $(( $# > 0 ? 1 : 0 ))
source "$(dirname "${BASH_SOURCE[0]}")/gigpo_setting.sh"

prepare_placeholder_data $((val_data_size * 2))  # verl-agent evaluates 2 x val_data_size WebShop tasks

train_gigpo_setting \
    data.max_prompt_length=4096 \
    actor_rollout_ref.actor.ppo_mini_batch_size=64 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8 \
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16 \
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=16 \
    env.env_name=progpo/WebShop-v0 \
    env.max_steps=15 \
    trainer.project_name='verl_agent_webshop' \
    "$@"
