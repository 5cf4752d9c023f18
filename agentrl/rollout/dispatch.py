"""Dynamic task dispatch (rollout.dispatch=dynamic): a step's tasks come from one queue, not a fixed split.

With the fixed split each rollout rank runs `tasks_per_step / R` groups, so a rank that drew long
episodes (or sits beside a slow env) holds the whole step while the others idle. Here every rank
runs at most `rollout.groups_in_flight` groups at once and asks for the next task each time one
finishes, so fast ranks take more of the step and all ranks finish close together.

The queue lives on rollout rank 0, in its event loop, which answers claims (polled every POLL_S)
while the engine's thread runs a batch, or between the engine's steps where they run on the loop
(`rollout.engine.steps_on`: the continuous scheduler's, whose steps are short). Other ranks send
a claim (`Tag.TASKS`) and poll for the answer (`Tag.TASK_REPLY`); rank 0 claims from the same
queue directly. A claim carries the keep verdicts (`Algorithm.keep_group`) of the groups that
finished since the last one, so dynamic sampling (DAPO) hands out more tasks exactly while the
step is short of kept groups: a step's total is `tasks_per_step` kept groups, as with the fixed
split, from at most `tasks_per_step * (1 + max_extra_rounds)` tasks.

At the end of a run, or after a stop, rank 0 and each other rank `close` the queue: rank 0 answers
every claim still waiting with [] and takes each rank's claims until its goodbye, and each rank takes
the answers to claims a stop cancelled until the goodbye's acknowledgement. No message is then left
unreceived, which MPI_Finalize would refuse ("unmatched messages").

Answers: a list of (task index, data position) to run; [] once the step hands out nothing more;
None for "nothing now, ask again with your next verdict" (some groups in flight may still be
dropped and need replacing). A rank with no group in flight is not told None: its claim is held
until another rank's verdict decides it. At the end of a step every rank sends its last verdicts
(`finished`), and rank 0's collect returns once all have, so the data position it sends with its
batch covers exactly the tasks of the steps up to this one. Claims for a later step (a rank
running ahead with rollout.max_staleness) wait until rank 0 opens that step.

Which rank runs a task decides its sampling stream, so dynamic runs are not bit-reproducible
the way fixed splits are; the tasks themselves (seeds, dataset rows) are the same.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass

from agentrl import transport
from agentrl.transport import Tag

POLL_S = 0.001  # asyncio's timers wake no sooner than about 1 ms

Claims = list[tuple[int, int | None]] | None  # (task index, data position) pairs; [] done; None: ask again later


@dataclass
class StepQueue:
    """The tasks of one step, handed out until it holds `target` kept groups or `budget` tasks were issued."""

    target: int
    budget: int
    issued: int = 0
    kept: int = 0
    in_flight: int = 0  # handed out, verdict not in yet

    @property
    def closed(self) -> bool:
        return self.issued >= self.budget or self.kept >= self.target

    def report(self, kept: int, dropped: int) -> None:
        self.kept += kept
        self.in_flight -= kept + dropped

    def take(self, want: int) -> range:
        """Task indices for up to `want` groups: no more than the step may still need if every group in
        flight is kept, and no more than the budget allows."""
        count = max(0, min(want, self.budget - self.issued, self.target - self.kept - self.in_flight))
        first = self.issued
        self.issued += count
        self.in_flight += count
        return range(first, first + count)

    def stats(self) -> dict[str, float]:
        """This step's queue-wide rollout stats (only rank 0 reports them; the trainer sums over ranks)."""
        return {
            "rollout/extra_rounds": float(math.ceil(max(0, self.issued - self.target) / self.target)),
            "rollout/groups_short": float(max(0, self.target - self.kept)),
        }


GOODBYE = {"goodbye": True}  # a rank's last message to rank 0, and rank 0's acknowledgement


class DispatchServer:
    """Rollout rank 0's side: the queue of the current step, its own claims and its peers'."""

    def __init__(self, comm, peers: list[int], tasks_per_step: int, max_extra_rounds: int, source):
        self.comm, self.peers = comm, peers
        self.target, self.budget = tasks_per_step, tasks_per_step * (1 + max_extra_rounds)
        self.source = source  # the task source whose data positions the queue reserves
        self.step: int | None = None
        self.queue: StepQueue | None = None
        self.held: list[tuple[int | asyncio.Future, int]] = []  # (peer rank or local future, want)
        self.later: list[tuple[int, dict]] = []  # claims for a step not open yet
        self.finished: set[int] = set()
        self.gone: set[int] = set()  # peers that said goodbye

    def open(self, step: int) -> None:
        self.step, self.queue = step, StepQueue(self.target, self.budget)
        self.held, self.finished = [], set()
        waiting, self.later = self.later, []
        for peer, message in waiting:
            self._handle(peer, message)

    async def claim(self, step: int, want: int, running: int, kept: int, dropped: int) -> Claims:
        """Rank 0's own claim (see the module docstring for the answers)."""
        self.queue.report(kept, dropped)
        self._release_held()
        answer = self._answer(want, running)
        if answer is not _HOLD:
            return answer
        future = asyncio.get_running_loop().create_future()
        self.held.append((future, want))
        return await future

    async def finish(self, step: int, kept: int, dropped: int) -> None:
        self.queue.report(kept, dropped)
        self._release_held()

    async def serve(self) -> None:
        """Answer peers until each has finished the step."""
        while not self.finished | self.gone >= set(self.peers):
            found, message, peer = transport.try_recv(self.comm, _any_source(), Tag.TASKS)
            if found:
                self._handle(peer, message)
            else:
                await asyncio.sleep(POLL_S)

    def close(self) -> None:
        """After this rank's last step: every claim still waiting gets [] (nothing more to run), and each peer's
        messages are taken until its goodbye."""
        for who, _ in self.held:
            if not isinstance(who, asyncio.Future):
                transport.send(self.comm, [], who, Tag.TASK_REPLY)
        for peer, message in self.later:
            if not message.get("finished"):
                transport.send(self.comm, [], peer, Tag.TASK_REPLY)
        self.held, self.later = [], []
        while self.gone != set(self.peers):
            message, peer = transport.recv(self.comm, _any_source(), Tag.TASKS)
            if message.get("goodbye"):
                self._goodbye(peer)
            elif not message.get("finished"):
                transport.send(self.comm, [], peer, Tag.TASK_REPLY)

    def _goodbye(self, peer: int) -> None:
        """`peer` ran its last step: its waiting claims need no answer; acknowledge, and send it nothing more."""
        self.gone.add(peer)
        self.held = [(who, want) for who, want in self.held if who != peer]
        self.later = [(who, message) for who, message in self.later if who != peer]
        transport.send(self.comm, GOODBYE, peer, Tag.TASK_REPLY)

    def _handle(self, peer: int, message: dict) -> None:
        if message.get("goodbye"):  # stopped between steps while this rank still serves one
            self._goodbye(peer)
            return
        if message["step"] != self.step:
            self.later.append((peer, message))
            return
        self.queue.report(message["kept"], message["dropped"])
        if message.get("finished"):
            self.finished.add(peer)
        else:
            answer = self._answer(message["want"], message["running"])
            if answer is _HOLD:
                self.held.append((peer, message["want"]))
            else:
                transport.send(self.comm, answer, peer, Tag.TASK_REPLY)
        self._release_held()

    def _answer(self, want: int, running: int):
        indices = self.queue.take(want)
        if indices:
            return list(zip(indices, self.source.reserve(len(indices)), strict=True))
        if self.queue.closed:
            return []
        return None if running else _HOLD

    def _release_held(self) -> None:
        held, self.held = self.held, []
        for who, want in held:
            answer = self._answer(want, 0)
            if answer is _HOLD:
                self.held.append((who, want))
            elif isinstance(who, asyncio.Future):
                who.set_result(answer)
            else:
                transport.send(self.comm, answer, who, Tag.TASK_REPLY)


class DispatchClient:
    """A rollout rank other than 0: claims go to rank 0 over MPI."""

    def __init__(self, comm, server: int):
        self.comm, self.server = comm, server

    async def claim(self, step: int, want: int, running: int, kept: int, dropped: int) -> Claims:
        message = {"step": step, "want": want, "running": running, "kept": kept, "dropped": dropped}
        transport.send(self.comm, message, self.server, Tag.TASKS)
        while True:
            found, answer, _ = transport.try_recv(self.comm, self.server, Tag.TASK_REPLY)
            if found:
                return answer
            await asyncio.sleep(POLL_S)

    async def finish(self, step: int, kept: int, dropped: int) -> None:
        message = {"step": step, "kept": kept, "dropped": dropped, "finished": True}
        transport.send(self.comm, message, self.server, Tag.TASKS)

    def close(self) -> int:
        """After this rank's last step: say goodbye, taking the answers to claims a stop cancelled until rank 0
        acknowledges it; how many such answers there were."""
        transport.send(self.comm, GOODBYE, self.server, Tag.TASKS)
        dropped = 0
        while transport.recv(self.comm, self.server, Tag.TASK_REPLY)[0] != GOODBYE:
            dropped += 1
        return dropped


_HOLD = object()  # answer later, once a verdict from another rank decides it


def _any_source() -> int:
    from mpi4py import MPI

    return MPI.ANY_SOURCE


def default_groups_in_flight(tasks_per_step: int, rollout_ranks: int) -> int:
    """Half a rank's fixed share (at least one group): enough to keep the engine's batches full, few
    enough that the step's last groups go to whichever rank frees up first."""
    return max(1, math.ceil(tasks_per_step / rollout_ranks / 2))
