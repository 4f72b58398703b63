"""Stand-in for verl-agent's ``env_manager.make_envs``: dispatch on substrings of ``env.env_name``."""


def make_envs(config):
    name = config["env"]["env_name"].lower()
    if "alfworld" in name:  # verl-agent builds only alfworld/AlfredTWEnv and alfworld/AlfredThorEnv
        if config["env"]["env_name"] not in ("alfworld/AlfredTWEnv", "alfworld/AlfredThorEnv"):
            raise ValueError(f"Unsupported environment: {config['env']['env_name']}")
        return "verl-agent's alfworld envs", "verl-agent's alfworld val envs"
    raise SystemExit("Environment not supported")
