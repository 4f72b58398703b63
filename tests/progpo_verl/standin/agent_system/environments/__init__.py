from agent_system.environments.env_manager import make_envs  # noqa: F401
