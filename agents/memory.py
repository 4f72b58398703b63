"""Per-episode memory of an LLM agent: the task and the (observation, action) pairs played so far.

The prompts are *step-independent* (verl-agent's design, ``agent_system/memory/memory.py`` ``SimpleMemory``):
each step's prompt is rebuilt from scratch from the task, the last ``history_length`` pairs and the current
observation, so the context does not grow with the episode. :class:`History` is the one record both the
evaluation harness and the training loop keep per trajectory.

Example:
    >>> history = History(task_text="put a clean mug in coffeemachine")
    >>> history.record("You are in the middle of a room.", "go to sinkbasin 1")
    >>> history.record("You arrive at sinkbasin 1.", "take mug 1 from sinkbasin 1")
    >>> history.num_steps
    2
    >>> print(history.render(1))
    [Observation 2: 'You arrive at sinkbasin 1.', Action 2: 'take mug 1 from sinkbasin 1']
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Turn:
    """One played step: the observation the agent saw and the action it sent to the env."""

    observation: str
    action: str


@dataclasses.dataclass
class History:
    """The task and every (observation, action) pair of one episode, oldest first.

    Attributes:
        task_text: The task in words (ALFWorld "Your task is to: ..." line, WebShop instruction).
        turns: Played steps, oldest first.
    """

    task_text: str = ""
    turns: list[Turn] = dataclasses.field(default_factory=list)

    def record(self, observation: str, action: str) -> None:
        """Append the step that showed ``observation`` and answered ``action``."""
        self.turns.append(Turn(observation, action))

    @property
    def num_steps(self) -> int:
        """Steps taken so far (all of them, not only those a prompt shows)."""
        return len(self.turns)

    def recent(self, history_length: int) -> list[tuple[int, Turn]]:
        """The last ``history_length`` turns with their 1-based step numbers."""
        if history_length <= 0:
            return []
        start = max(0, len(self.turns) - history_length)
        return [(start + i + 1, turn) for i, turn in enumerate(self.turns[start:])]

    def render(self, history_length: int) -> str:
        """The last ``history_length`` turns, as ``[Observation n: '..', Action n: '..']`` lines."""
        return "\n".join(
            f"[Observation {n}: '{turn.observation}', Action {n}: '{turn.action}']"
            for n, turn in self.recent(history_length)
        )
