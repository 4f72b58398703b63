"""An ALFWorld expert that plans from the true game state (the engine's facts).

ALFWorld ships two experts (``alfworld.agents.expert.HandCodedTWAgent`` and the fast-downward planner behind
``AlfredExpert(expert_type="planner")``). The handcoded one searches with object→receptacle priors and never
finishes a pick-two task (it loops after placing the first object); the planner is optimal but can run for
many CPU-minutes and gigabytes on a single game. This expert is neither: it reads the *complete* state the
engine reports (``facts``: where every object is, what is open, what the agent holds) and computes, at every
step, the shortest plan among a small set of plan shapes that cover the six ALFWorld task types:

* place tasks (pick, clean, heat, cool, pick two): ``[drop what is held] → for each needed object: go to its
  receptacle, open it, take it, [go to the sink/microwave/fridge and clean/heat/cool it], go to the goal
  receptacle, open it, move it there``;
* look-at-in-light: ``[drop what is held] → fetch the object → go to the lamp's receptacle → use the lamp``.

Every choice (which object instance, which of its receptacles, which goal receptacle, which appliance, which
lamp) is enumerated and the shortest command list wins; ties break on the command text, so the expert is
deterministic. Going somewhere costs one step whatever the distance (``GotoLocation`` in ``alfred.pddl`` has
unit cost), so the plan length is the exact step count. Because the plan is recomputed from the facts each
step, the expert also gives the right next action from any state a learning agent has wandered into (holding
the wrong object, a receptacle left open, ...), which is what ``info["expert_action"]`` needs.

The PDDL semantics it relies on are those of ``alfworld/data/alfred.pddl`` (alfworld 0.4.2): ``PickupObject``
needs the receptacle opened if openable and empty hands; ``PutObject`` needs ``canContain``; ``CleanObject`` /
``HeatObject`` / ``CoolObject`` need a ``SinkBasinType`` / ``MicrowaveType`` / ``FridgeType`` receptacle at
the agent's location (not opened); ``ToggleObject`` needs the lamp ``inReceptacle`` a receptacle at the
agent's location. The goals are those of ``alfworld.gen.goal_library.gdict``.

Example:
    >>> from textworld.logic import Proposition, Variable
    >>> def fact(name, *args):
    ...     return Proposition(name, [Variable(a, t) for a, t in args])
    >>> facts = [
    ...     fact("atlocation", ("agent1", "agent"), ("loc 3", "location")),
    ...     fact("receptacleatlocation", ("drawer 1", "receptacle"), ("loc 1", "location")),
    ...     fact("receptacleatlocation", ("desk 1", "receptacle"), ("loc 2", "location")),
    ...     fact("receptacletype", ("drawer 1", "receptacle"), ("drawertype ", "rtype")),
    ...     fact("receptacletype", ("desk 1", "receptacle"), ("desktype ", "rtype")),
    ...     fact("openable", ("drawer 1", "receptacle")),
    ...     fact("objecttype", ("pen 1", "object"), ("pentype ", "otype")),
    ...     fact("pickupable", ("pen 1", "object")),
    ...     fact("inreceptacle", ("pen 1", "object"), ("drawer 1", "receptacle")),
    ...     fact("cancontain", ("desktype ", "rtype"), ("pentype ", "otype")),
    ... ]
    >>> expert = ALFWorldExpert({"task_type": "pick_and_place_simple",
    ...                          "pddl_params": {"object_target": "Pen", "parent_target": "Desk"}})
    >>> expert.plan(facts)
    ['go to drawer 1', 'open drawer 1', 'take pen 1 from drawer 1', 'go to desk 1', 'move pen 1 to desk 1']
    >>> expert.next_action(facts)
    'go to drawer 1'
"""

from __future__ import annotations

import dataclasses
import enum
import itertools
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from progpo_envs.alfworld.task_types import TaskType


class PlaceWording(str, enum.Enum):
    """How the game's grammar words ``PutObject``: alfworld 0.4 (``move``) or older releases (``put``)."""

    MOVE = "move"
    PUT = "put"

    def command(self, obj: str, receptacle: str) -> str:
        """The placing command for ``obj`` and ``receptacle`` in this wording."""
        if self is PlaceWording.MOVE:
            return f"move {obj} to {receptacle}"
        return f"put {obj} in/on {receptacle}"


@dataclasses.dataclass(frozen=True)
class _Transform:
    """A state change a task asks for, with the appliance type and command verb of ``alfred.pddl``."""

    appliance_type: str
    predicate: str
    verb: str


_TRANSFORMS = {
    TaskType.CLEAN: _Transform("sinkbasintype", "isclean", "clean"),
    TaskType.HEAT: _Transform("microwavetype", "ishot", "heat"),
    TaskType.COOL: _Transform("fridgetype", "iscool", "cool"),
}


def type_name(alfred_class: str) -> str:
    """The engine's name of the PDDL type constant of an ALFRED class: ``"DeskLamp"`` → ``"desklamptype"``."""
    return f"{alfred_class.strip().lower()}type"


@dataclasses.dataclass
class WorldState:
    """The parts of an ALFWorld state the expert plans over, keyed by the names the agent sees.

    Attributes:
        agent_location: The location the agent stands at.
        receptacle_location: Receptacle → its location.
        receptacle_type: Receptacle → its type constant (``"drawertype"``).
        object_type: Object → its type constant (``"pentype"``).
        containers: Object → the receptacles it is ``inReceptacle`` (sorted; real scenes list some objects
            twice).
        openable: Receptacles that must be opened before taking from or putting into them.
        opened: Receptacles that are open.
        held: Objects the agent holds.
        pickupable: Objects that can be taken.
        can_contain: ``(rtype, otype)`` pairs a ``PutObject`` accepts.
        flags: Unary object predicate (``isclean``, ``ishot``, ``iscool``, ``istoggled``, ``toggleable``) →
            objects.
    """

    agent_location: str | None = None
    receptacle_location: dict[str, str] = dataclasses.field(default_factory=dict)
    receptacle_type: dict[str, str] = dataclasses.field(default_factory=dict)
    object_type: dict[str, str] = dataclasses.field(default_factory=dict)
    containers: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    openable: set[str] = dataclasses.field(default_factory=set)
    opened: set[str] = dataclasses.field(default_factory=set)
    held: set[str] = dataclasses.field(default_factory=set)
    pickupable: set[str] = dataclasses.field(default_factory=set)
    can_contain: set[tuple[str, str]] = dataclasses.field(default_factory=set)
    flags: dict[str, set[str]] = dataclasses.field(default_factory=dict)

    @classmethod
    def from_facts(cls, facts: Iterable[Any]) -> WorldState:
        """Build the state from the engine's facts.

        Args:
            facts: ``textworld.logic.Proposition`` objects as the PDDL env reports them with
                ``EnvInfos(facts=True)`` (lower-case predicate names; arguments named as the demangler names
                them, e.g. ``"drawer 3"``). Any object with ``.name`` and ``.arguments`` (each with ``.name``)
                works.
        """
        state = cls()
        containers: dict[str, set[str]] = {}
        for fact in facts:
            predicate = fact.name
            args = [argument.name.strip() for argument in fact.arguments]
            if predicate == "atlocation":
                state.agent_location = args[1]
            elif predicate == "receptacleatlocation":
                state.receptacle_location[args[0]] = args[1]
            elif predicate == "receptacletype":
                state.receptacle_type[args[0]] = args[1]
            elif predicate == "objecttype":
                state.object_type[args[0]] = args[1]
            elif predicate == "inreceptacle":
                containers.setdefault(args[0], set()).add(args[1])
            elif predicate == "openable":
                state.openable.add(args[0])
            elif predicate == "opened":
                state.opened.add(args[0])
            elif predicate == "holds":
                state.held.add(args[1])
            elif predicate == "pickupable":
                state.pickupable.add(args[0])
            elif predicate == "cancontain":
                state.can_contain.add((args[0], args[1]))
            elif predicate in ("isclean", "ishot", "iscool", "istoggled", "toggleable"):
                state.flags.setdefault(predicate, set()).add(args[0])
        state.containers = {obj: sorted(recs) for obj, recs in containers.items()}
        return state

    def has_flag(self, obj: str, predicate: str) -> bool:
        """Whether the unary predicate holds for ``obj``."""
        return obj in self.flags.get(predicate, ())


class _Simulation:
    """A command list under construction, tracking the few state changes the plan shapes cause."""

    def __init__(self, state: WorldState, wording: PlaceWording) -> None:
        self.state = state
        self.wording = wording
        self.location = state.agent_location
        self.opened = set(state.opened)
        self.commands: list[str] = []

    def go_to(self, receptacle: str) -> None:
        target = self.state.receptacle_location.get(receptacle)
        if target != self.location:
            self.commands.append(f"go to {receptacle}")
            self.location = target

    def access(self, receptacle: str) -> None:
        """Go to ``receptacle`` and open it if it must be open to take from or put into it."""
        self.go_to(receptacle)
        if receptacle in self.state.openable and receptacle not in self.opened:
            self.commands.append(f"open {receptacle}")
            self.opened.add(receptacle)

    def take(self, obj: str, receptacle: str) -> None:
        self.access(receptacle)
        self.commands.append(f"take {obj} from {receptacle}")

    def put(self, obj: str, receptacle: str) -> None:
        self.access(receptacle)
        self.commands.append(self.wording.command(obj, receptacle))

    def transform(self, obj: str, appliance: str, verb: str) -> None:
        self.go_to(appliance)
        self.commands.append(f"{verb} {obj} with {appliance}")


def _shortest(plans: Iterable[list[str]]) -> list[str] | None:
    """The shortest plan; ties break on the command texts (deterministic)."""
    best: list[str] | None = None
    for plan in plans:
        if best is None or (len(plan), plan) < (len(best), best):
            best = plan
    return best


class ALFWorldExpert:
    """Solves an ALFWorld task from the true state; see the module docstring for the method.

    Args:
        task: The task's ``traj_data.json`` content, or any mapping with ``task_type`` (one of
            :class:`TaskType`) and ``pddl_params`` (``object_target``, ``parent_target``, ``toggle_target`` as
            ALFRED class names).
        wording: The placing command wording of the game's grammar. When ``next_action`` gets the admissible
            commands and a placing command is among them, its wording is used instead.

    Raises:
        ValueError: for an unknown task type or missing targets.
    """

    def __init__(self, task: Mapping[str, Any], wording: PlaceWording | str = PlaceWording.MOVE) -> None:
        try:
            self.task_type = TaskType(task["task_type"])
        except (KeyError, ValueError) as error:
            raise ValueError(f"unknown ALFWorld task_type in {dict(task)!r}") from error
        params = task.get("pddl_params") or {}
        if not params.get("object_target"):
            raise ValueError(f"task has no pddl_params.object_target: {dict(task)!r}")
        self.object_type = type_name(params["object_target"])
        # Look tasks need a lamp of the toggle type; the others a goal receptacle of the parent type.
        self.lamp_type = self.goal_receptacle_type = ""
        if self.task_type is TaskType.LOOK:
            if not params.get("toggle_target"):
                raise ValueError("a look_at_obj_in_light task needs pddl_params.toggle_target")
            self.lamp_type = type_name(params["toggle_target"])
        else:
            if not params.get("parent_target"):
                raise ValueError(f"a {self.task_type.value} task needs pddl_params.parent_target")
            self.goal_receptacle_type = type_name(params["parent_target"])
        self.wording = PlaceWording(wording)

    # --- public API ---

    def next_action(self, facts: Iterable[Any], admissible_commands: Sequence[str] | None = None) -> str:
        """The expert's next command in the state described by ``facts``.

        Args:
            facts: The engine's facts (see :meth:`WorldState.from_facts`).
            admissible_commands: The engine's admissible commands, if known; used to pick the placing wording.

        Returns:
            The first command of :meth:`plan`, or ``"look"`` when the task is already solved or cannot be
            solved from this state (the engine answers ``look`` harmlessly).
        """
        wording = self.wording
        if admissible_commands is not None:
            wording = self._wording_of(admissible_commands)
        plan = self.plan(facts, wording=wording)
        return plan[0] if plan else "look"

    def plan(self, facts: Iterable[Any], wording: PlaceWording | None = None) -> list[str]:
        """The full command list that solves the task from the state described by ``facts``.

        Returns an empty list when the goal already holds or no plan shape reaches it.
        """
        return self.plan_state(WorldState.from_facts(facts), wording)

    def plan_state(self, state: WorldState, wording: PlaceWording | None = None) -> list[str]:
        """Like :meth:`plan`, from an already built :class:`WorldState`."""
        wording = wording or self.wording
        if self.task_type is TaskType.LOOK:
            return self._plan_look(state, wording) or []
        return self._plan_place(state, wording) or []

    # --- plan shapes ---

    def _wording_of(self, admissible_commands: Sequence[str]) -> PlaceWording:
        for command in admissible_commands:
            if command.startswith("move "):
                return PlaceWording.MOVE
            if command.startswith("put ") and " in/on " in command:
                return PlaceWording.PUT
        return self.wording

    def _targets(self, state: WorldState) -> list[str]:
        return sorted(
            obj
            for obj, kind in state.object_type.items()
            if kind == self.object_type and (obj in state.pickupable or obj in state.held)
        )

    def _sources(self, state: WorldState, obj: str) -> list[str]:
        """Where ``obj`` can be taken from (empty when it is held)."""
        if obj in state.held:
            return []
        return [r for r in state.containers.get(obj, []) if r in state.receptacle_location]

    def _drop_held(self, sim: _Simulation, keep: str | None) -> bool:
        """Put down whatever is held except ``keep``, at the cheapest receptacle that accepts it."""
        for obj in sorted(sim.state.held):
            if obj == keep:
                continue
            kind = sim.state.object_type.get(obj)
            options = []
            for receptacle in sorted(sim.state.receptacle_location):
                if (sim.state.receptacle_type.get(receptacle), kind) not in sim.state.can_contain:
                    continue
                trial = _Simulation(sim.state, sim.wording)
                trial.location, trial.opened = sim.location, set(sim.opened)
                trial.put(obj, receptacle)
                options.append((len(trial.commands), trial.commands, trial))
            if not options:
                return False
            _, commands, trial = min(options, key=lambda option: (option[0], option[1]))
            sim.commands.extend(commands)
            sim.location, sim.opened = trial.location, trial.opened
        return True

    def _plan_place(self, state: WorldState, wording: PlaceWording) -> list[str] | None:
        transform = _TRANSFORMS.get(self.task_type)
        needed = 2 if self.task_type is TaskType.PICK_TWO else 1
        targets = self._targets(state)

        def done(obj: str) -> bool:
            return transform is None or state.has_flag(obj, transform.predicate)

        goal_receptacles = sorted(
            r for r, kind in state.receptacle_type.items() if kind == self.goal_receptacle_type
        )
        accepting = [
            r for r in goal_receptacles if (self.goal_receptacle_type, self.object_type) in state.can_contain
        ]
        goal_receptacles = accepting or goal_receptacles
        appliances = [None]
        if transform is not None:
            appliances = sorted(
                r for r, kind in state.receptacle_type.items() if kind == transform.appliance_type
            )

        def candidates() -> Iterable[list[str]]:
            for destination in goal_receptacles:
                placed = [o for o in targets if destination in state.containers.get(o, []) and done(o)]
                placed = [o for o in placed if o not in state.held]
                missing = needed - len(placed)
                if missing <= 0:
                    yield []
                    return
                movable = [
                    o for o in targets if o not in placed and (o in state.held or self._sources(state, o))
                ]
                for chosen in itertools.permutations(movable, missing):
                    if any(o in state.held for o in chosen[1:]):
                        continue  # only the first object can already be in hand
                    for appliance in appliances:
                        plan = self._simulate_place(state, wording, chosen, destination, appliance, transform)
                        if plan is not None:
                            yield plan

        return _shortest(candidates())

    def _simulate_place(
        self,
        state: WorldState,
        wording: PlaceWording,
        chosen: Sequence[str],
        destination: str,
        appliance: str | None,
        transform: _Transform | None,
    ) -> list[str] | None:
        best_source_plans: list[str] | None = None
        # An object may sit in several receptacles (real scenes); try each first source, the rest follow
        # greedily.
        first_sources = self._sources(state, chosen[0]) or [None]
        for first_source in first_sources:
            sim = _Simulation(state, wording)
            if not self._drop_held(sim, keep=chosen[0]):
                return None
            feasible = True
            for index, obj in enumerate(chosen):
                if obj not in state.held:
                    sources = [first_source] if index == 0 else self._sources(state, obj)
                    source = min(sources, key=lambda r: (self._reach_cost(sim, r), r)) if sources else None
                    if source is None:
                        feasible = False
                        break
                    sim.take(obj, source)
                if transform is not None and not state.has_flag(obj, transform.predicate):
                    if appliance is None:
                        feasible = False
                        break
                    sim.transform(obj, appliance, transform.verb)
                sim.put(obj, destination)
            if feasible:
                best_source_plans = _shortest(p for p in (best_source_plans, sim.commands) if p is not None)
        return best_source_plans

    @staticmethod
    def _reach_cost(sim: _Simulation, receptacle: str) -> int:
        cost = 0 if sim.state.receptacle_location.get(receptacle) == sim.location else 1
        if receptacle in sim.state.openable and receptacle not in sim.opened:
            cost += 1
        return cost

    def _plan_look(self, state: WorldState, wording: PlaceWording) -> list[str] | None:
        lamps = sorted(
            obj
            for obj, kind in state.object_type.items()
            if kind == self.lamp_type and state.has_flag(obj, "toggleable")
        )
        lamp_spots = [
            (lamp, r)
            for lamp in lamps
            for r in state.containers.get(lamp, [])
            if r in state.receptacle_location
        ]
        targets = [o for o in self._targets(state) if o in state.held or self._sources(state, o)]

        def candidates() -> Iterable[list[str]]:
            for obj in targets:
                for source in self._sources(state, obj) or [None]:
                    for lamp, lamp_receptacle in lamp_spots:
                        sim = _Simulation(state, wording)
                        if not self._drop_held(sim, keep=obj):
                            continue
                        if source is not None:
                            sim.take(obj, source)
                        already_there = sim.location == state.receptacle_location[lamp_receptacle]
                        if already_there and state.has_flag(lamp, "istoggled") and not sim.commands:
                            yield []
                            return
                        sim.go_to(lamp_receptacle)
                        if not state.has_flag(lamp, "istoggled"):
                            sim.commands.append(f"use {lamp}")
                        yield sim.commands

        return _shortest(candidates())


class ExpertMode(str, enum.Enum):
    """What the env's expert may know (``expert_mode`` of ``progpo/ALFWorld-v0``)."""

    PLANNER = "planner"
    """The true state: it walks straight to objects it has never seen (:class:`ALFWorldExpert`)."""
    SEARCHING = "searching"
    """Only what the agent has seen: :class:`SearchingExpert`."""


class SearchingExpert:
    """The planner limited to what the agent has observed: it searches for what it has not seen yet.

    Demonstrations of the true-state planner cannot be imitated from observations: its first command goes
    straight to a receptacle where the target hides, which nothing in the agent's prompt reveals. This expert
    follows the planner's command except when that command is ``go to X`` for an ``X`` the agent has no
    reason to visit — not yet searched, and not the goal receptacle named by the task. It then searches
    instead: at an unsearched closed receptacle it opens it; otherwise it goes to the first unsearched
    receptacle in the order of the admissible ``go to`` commands (the order the prompt lists them). A
    receptacle counts as searched once the agent has stood at it with its content visible (open, or not
    openable). Everything it does is thus explainable from the episode's observations, like a person's
    search.

    Call :meth:`reset` at the start of an episode and :meth:`record` after each command the engine executed.

    Example:
        >>> expert = SearchingExpert(ALFWorldExpert({"task_type": "pick_and_place_simple",
        ...     "pddl_params": {"object_target": "Pen", "parent_target": "Desk"}}))
        >>> expert.reset()
        >>> expert.search_step(["go to bed 1", "go to desk 1", "go to drawer 1", "look"])
        'go to bed 1'
    """

    def __init__(self, planner: ALFWorldExpert) -> None:
        self.planner = planner
        self.location: str | None = None
        self.searched: set[str] = set()

    def reset(self) -> None:
        """Forget the previous episode (the agent starts in the middle of the room)."""
        self.location, self.searched = None, set()

    def record(self, command: str) -> None:
        """Update what the agent has seen after the engine executed ``command``."""
        if command.startswith("go to "):
            self.location = command[len("go to ") :]
        elif command.startswith("open ") and command[len("open ") :] == self.location:
            self.searched.add(self.location)

    def next_action(self, facts: Iterable[Any], admissible_commands: Sequence[str]) -> str:
        """The next command, given the true facts (for the planner) and what the agent has seen."""
        self._note_visible(admissible_commands)
        planned = self.planner.next_action(facts, admissible_commands)
        if not planned.startswith("go to "):
            return planned  # take/move/open/use/heat...: act on what is in front of the agent
        target = planned[len("go to ") :]
        goal_type = self.planner.goal_receptacle_type
        if target in self.searched or (goal_type and target.split(" ")[0] == goal_type):
            return planned
        return self.search_step(admissible_commands) or planned

    def search_step(self, admissible_commands: Sequence[str]) -> str | None:
        """Open the unsearched receptacle the agent stands at, else go to the next unsearched one."""
        self._note_visible(admissible_commands)
        if self.location is not None and self.location not in self.searched:
            return f"open {self.location}"  # _note_visible left it unsearched: it is closed
        for command in admissible_commands:
            if command.startswith("go to ") and command[len("go to ") :] not in self.searched:
                return command
        return None

    def _note_visible(self, admissible_commands: Sequence[str]) -> None:
        # At a receptacle that cannot be opened now, its content is in the arrival observation.
        if self.location is not None and f"open {self.location}" not in admissible_commands:
            self.searched.add(self.location)
