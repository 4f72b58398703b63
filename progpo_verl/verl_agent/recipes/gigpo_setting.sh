# The settings run_alfworld.sh and run_webshop.sh share, sourced by them (after they set ENGINE): verl-agent's
# examples/gigpo_trainer/run_{alfworld,webshop}.sh, the GiGPO paper's Qwen2.5-1.5B-Instruct setting on 2 GPUs
# (16 task groups x 8 rollouts, 150 epochs, gamma 0.95, lr 1e-6, KL loss 0.01, invalid-action penalty 0.1).
#
#   ESTIMATOR       progpo (default) | g2po | graphgpo | progpo_coverage | progpo_gigpo | gigpo (verl-agent's)
#   VERL_AGENT_DIR  a verl-agent checkout: its examples.data_preprocess.prepare writes the placeholder parquet
#                   files the trainer's data loader reads (the envs make the prompts)
ESTIMATOR=${ESTIMATOR:-progpo}
: "${VERL_AGENT_DIR:?set VERL_AGENT_DIR to a verl-agent checkout}"

train_data_size=16
val_data_size=128
group_size=8

# prepare_placeholder_data VAL_TASKS: verl-agent's placeholder parquet files, train_data_size and VAL_TASKS rows.
prepare_placeholder_data() {
    (cd "$VERL_AGENT_DIR" && python3 -m examples.data_preprocess.prepare \
        --mode 'text' \
        --train_data_size $train_data_size \
        --val_data_size "$1")
}

# train_gigpo_setting OVERRIDE...: the launcher with the shared settings, then the Hydra overrides OVERRIDE...
# (the recipe's own, then the user's).
train_gigpo_setting() {
    python3 -m progpo_verl.verl_agent \
        algorithm.adv_estimator=$ESTIMATOR \
        data.train_files=$HOME/data/verl-agent/text/train.parquet \
        data.val_files=$HOME/data/verl-agent/text/test.parquet \
        data.train_batch_size=$train_data_size \
        data.val_batch_size=$val_data_size \
        data.max_response_length=512 \
        data.filter_overlong_prompts=True \
        data.truncation='error' \
        data.return_raw_chat=True \
        actor_rollout_ref.model.path=Qwen/Qwen2.5-1.5B-Instruct \
        actor_rollout_ref.actor.optim.lr=1e-6 \
        actor_rollout_ref.model.use_remove_padding=True \
        actor_rollout_ref.actor.use_kl_loss=True \
        actor_rollout_ref.actor.kl_loss_coef=0.01 \
        actor_rollout_ref.actor.kl_loss_type=low_var_kl \
        actor_rollout_ref.model.enable_gradient_checkpointing=True \
        actor_rollout_ref.actor.fsdp_config.param_offload=False \
        actor_rollout_ref.actor.fsdp_config.optimizer_offload=False \
        actor_rollout_ref.rollout.tensor_model_parallel_size=2 \
        actor_rollout_ref.rollout.name=$ENGINE \
        actor_rollout_ref.rollout.gpu_memory_utilization=0.6 \
        actor_rollout_ref.rollout.enable_chunked_prefill=False \
        actor_rollout_ref.rollout.enforce_eager=False \
        actor_rollout_ref.rollout.free_cache_engine=False \
        actor_rollout_ref.rollout.val_kwargs.temperature=0.4 \
        actor_rollout_ref.rollout.val_kwargs.do_sample=True \
        actor_rollout_ref.ref.fsdp_config.param_offload=True \
        actor_rollout_ref.actor.use_invalid_action_penalty=True \
        actor_rollout_ref.actor.invalid_action_penalty_coef=0.1 \
        algorithm.use_kl_in_reward=False \
        algorithm.gamma=0.95 \
        env.progpo.vector_mode=async \
        env.seed=0 \
        env.history_length=2 \
        env.rollout.n=$group_size \
        trainer.critic_warmup=0 \
        trainer.logger=['console','wandb'] \
        trainer.experiment_name="${ESTIMATOR}_qwen2.5_1.5b" \
        trainer.n_gpus_per_node=2 \
        trainer.nnodes=1 \
        trainer.save_freq=-1 \
        trainer.test_freq=5 \
        trainer.total_epochs=150 \
        trainer.val_before_train=True \
        "$@"
}
