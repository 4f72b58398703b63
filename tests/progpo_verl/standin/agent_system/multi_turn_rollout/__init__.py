from agent_system.multi_turn_rollout.rollout_loop import TrajectoryCollector, adjust_batch  # noqa: F401
