#!/usr/bin/env bash
# WebShop, Qwen2.5-1.5B-Instruct on 2 GPUs: the GiGPO paper's setting, as verl-agent's
# examples/gigpo_trainer/run_webshop.sh runs it (16 task groups x 8 rollouts, <= 15 steps, 150 epochs,
# gamma 0.95, lr 1e-6, KL loss 0.01, invalid-action penalty 0.1), with our estimator and our WebShop env
# (in-process on the self-hosted catalog; env.progpo.kwargs pass its options, e.g. a shop server url).
#
#   VERL_AGENT_DIR=~/verl-agent bash progpo_verl/verl_agent/recipes/run_webshop.sh [vllm|sglang] [OVERRIDE...]
#
#   ESTIMATOR       progpo (default) | g2po | graphgpo | progpo_coverage | progpo_gigpo | gigpo (verl-agent's)
#   VERL_AGENT_DIR  a verl-agent checkout: its examples.data_preprocess.prepare writes the placeholder parquet
#                   files the trainer's data loader reads (the envs make the prompts)
# Extra arguments are Hydra overrides, after these (e.g. trainer.logger=['console']).
set -euo pipefail
ulimit -u 65536 2>/dev/null || true  # as verl-agent's WebShop script
ENGINE=${1:-vllm}
shift $(( $# > 0 ? 1 : 0 ))
ESTIMATOR=${ESTIMATOR:-progpo}
: "${VERL_AGENT_DIR:?set VERL_AGENT_DIR to a verl-agent checkout}"

train_data_size=16
val_data_size=128
group_size=8

(cd "$VERL_AGENT_DIR" && python3 -m examples.data_preprocess.prepare \
    --mode 'text' \
    --train_data_size $train_data_size \
    --val_data_size $((val_data_size * 2)))  # verl-agent evaluates 2 x val_data_size WebShop tasks

python3 -m progpo_verl.verl_agent \
    algorithm.adv_estimator=$ESTIMATOR \
    data.train_files=$HOME/data/verl-agent/text/train.parquet \
    data.val_files=$HOME/data/verl-agent/text/test.parquet \
    data.train_batch_size=$train_data_size \
    data.val_batch_size=$val_data_size \
    data.max_prompt_length=4096 \
    data.max_response_length=512 \
    data.filter_overlong_prompts=True \
    data.truncation='error' \
    data.return_raw_chat=True \
    actor_rollout_ref.model.path=Qwen/Qwen2.5-1.5B-Instruct \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.model.use_remove_padding=True \
    actor_rollout_ref.actor.ppo_mini_batch_size=64 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8 \
    actor_rollout_ref.actor.use_kl_loss=True \
    actor_rollout_ref.actor.kl_loss_coef=0.01 \
    actor_rollout_ref.actor.kl_loss_type=low_var_kl \
    actor_rollout_ref.model.enable_gradient_checkpointing=True \
    actor_rollout_ref.actor.fsdp_config.param_offload=False \
    actor_rollout_ref.actor.fsdp_config.optimizer_offload=False \
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16 \
    actor_rollout_ref.rollout.tensor_model_parallel_size=2 \
    actor_rollout_ref.rollout.name=$ENGINE \
    actor_rollout_ref.rollout.gpu_memory_utilization=0.6 \
    actor_rollout_ref.rollout.enable_chunked_prefill=False \
    actor_rollout_ref.rollout.enforce_eager=False \
    actor_rollout_ref.rollout.free_cache_engine=False \
    actor_rollout_ref.rollout.val_kwargs.temperature=0.4 \
    actor_rollout_ref.rollout.val_kwargs.do_sample=True \
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=16 \
    actor_rollout_ref.ref.fsdp_config.param_offload=True \
    actor_rollout_ref.actor.use_invalid_action_penalty=True \
    actor_rollout_ref.actor.invalid_action_penalty_coef=0.1 \
    algorithm.use_kl_in_reward=False \
    algorithm.gamma=0.95 \
    env.env_name=progpo/WebShop-v0 \
    env.progpo.vector_mode=async \
    env.seed=0 \
    env.max_steps=15 \
    env.history_length=2 \
    env.rollout.n=$group_size \
    trainer.critic_warmup=0 \
    trainer.logger=['console','wandb'] \
    trainer.project_name='verl_agent_webshop' \
    trainer.experiment_name="${ESTIMATOR}_qwen2.5_1.5b" \
    trainer.n_gpus_per_node=2 \
    trainer.nnodes=1 \
    trainer.save_freq=-1 \
    trainer.test_freq=5 \
    trainer.total_epochs=150 \
    trainer.val_before_train=True "$@"
