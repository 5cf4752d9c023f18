"""`mpirun -n N agentrl serve`: rank 0 takes every HTTP request and spreads the generations over all N engines.

Rank 0 runs an engine too: on a node with one GPU per rank a front-only rank 0 would leave a GPU idle, and the
front's work per call (parse, render, one pickled message) is small beside a generation. Each generation goes to
the rank with the fewest in flight (ties in turn), as a pickled `Generation` (prompt ids, sampling, stop strings)
with Tag.SERVE_REQUEST; the engine rank answers with the `GenerateOutput` (Tag.SERVE_REPLY). Rank 0's own
generations stream token by token; another rank's arrive whole, so a stream of one shows its text in one chunk.

A call whose client went away cancels its generations: rank 0 sends `{"cancel": id}`, the engine rank cancels that
generation (it leaves the engine at the next decode step) and confirms with `{"id", "cancelled", "dropped"}`
(`dropped` false: it had answered already); until then the rank's `in_flight` (GET /health) still counts it.

Stopping: rank 0 sends every engine rank `{"stop"}`; each aborts what is in flight, answers it, and sends
`{"stopped"}` last, so no message is left unreceived when MPI ends. An engine rank that gets a signal itself
asks rank 0 to stop the server (`{"stop_request"}`).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable

from agentrl import transport
from agentrl.engine.base import GenerateOutput
from agentrl.serve.generation import Generation, LocalBackend, OnTokens
from agentrl.transport import MAX_SLEEP_S, MIN_SLEEP_S, Tag

# Polls for messages sleep from MIN_SLEEP_S doubling to this while nothing comes; a message resets them.
BUSY_MAX_SLEEP_S = 1e-3


class _Sleeps:
    """Async sleeps between polls: short right after a message, growing while none comes."""

    def __init__(self, busy_max_s: float = BUSY_MAX_SLEEP_S, idle_max_s: float = MAX_SLEEP_S):
        self.busy_max_s, self.idle_max_s = busy_max_s, idle_max_s
        self.delay = MIN_SLEEP_S

    def reset(self) -> None:
        self.delay = MIN_SLEEP_S

    async def sleep(self, busy: bool) -> None:
        await asyncio.sleep(self.delay)
        self.delay = min(self.delay * 2, self.busy_max_s if busy else self.idle_max_s)


class RankSpread:
    """Rank 0's backend: `generate` on the least-loaded rank, this one included."""

    def __init__(self, comm, local: LocalBackend, on_stop_request: Callable[[str], None]):
        self.comm = comm
        self.local = local
        self.size = comm.Get_size()
        self.on_stop_request = on_stop_request
        self.in_flight = [0] * self.size
        self.served = [0] * self.size
        self.dropping = [0] * self.size  # cancelled generations an engine rank has not confirmed dropping yet
        self.dropped = [0] * self.size  # generations a rank stopped before their end (their client went away)
        self.turn = 0
        self.ids = itertools.count()
        self.waiting: dict[int, tuple[int, asyncio.Future]] = {}
        self.sends: list = []
        self.stopped: set[int] = set()
        self.closing = False

    @property
    def weight_version(self) -> int:
        return self.local.weight_version

    @property
    def grammars(self) -> bool:
        """Whether requests may carry an output grammar (every rank runs the same engine as this one)."""
        return self.local.grammars

    def health(self) -> dict:
        ranks = [
            {"rank": r, "in_flight": self.in_flight[r] + self.dropping[r], "served": self.served[r], "dropped": d}
            for r, d in enumerate([self.local.dropped, *self.dropped[1:]])
        ]
        return {"ranks": ranks}

    def _pick(self) -> int:
        self.turn = (self.turn + 1) % self.size
        return min(range(self.size), key=lambda r: (self.in_flight[r], (r - self.turn) % self.size))

    async def generate(self, request: Generation, on_tokens: OnTokens | None = None) -> GenerateOutput:
        if self.closing:
            raise RuntimeError("the server is stopping")
        rank = self._pick()
        self.in_flight[rank] += 1
        try:
            if rank == 0:
                return await self.local.generate(request, on_tokens)
            output = await self._remote(rank, request)
            if on_tokens is not None and len(output.output_ids):
                on_tokens(output.output_ids.tolist(), output.logprobs.tolist())
            return output
        finally:
            self.in_flight[rank] -= 1
            self.served[rank] += 1

    async def _remote(self, rank: int, request: Generation) -> GenerateOutput:
        call_id = next(self.ids)
        future = asyncio.get_running_loop().create_future()
        self.waiting[call_id] = (rank, future)
        self.sends.append(transport.isend(self.comm, {"id": call_id, "generation": request}, rank, Tag.SERVE_REQUEST))
        try:
            return await future
        except asyncio.CancelledError:  # the caller went away: the engine rank drops the generation too
            self.dropping[rank] += 1
            self.sends.append(transport.isend(self.comm, {"cancel": call_id}, rank, Tag.SERVE_REQUEST))
            raise
        finally:
            self.waiting.pop(call_id, None)

    async def poll(self) -> None:
        """Take the engine ranks' replies until every one has said `stopped` (run alongside the HTTP server)."""
        from mpi4py import MPI

        sleeps = _Sleeps()
        while len(self.stopped) < self.size - 1:
            self.sends = [request for request in self.sends if not request.test()[0]]
            found, message, source = transport.try_recv(self.comm, MPI.ANY_SOURCE, Tag.SERVE_REPLY)
            if not found:
                await sleeps.sleep(busy=bool(self.waiting or self.sends or any(self.dropping)))
                continue
            sleeps.reset()
            if "stopped" in message:
                self.stopped.add(source)
            elif "cancelled" in message:
                self.dropping[source] -= 1
                self.dropped[source] += message["dropped"]
            elif "stop_request" in message:
                self.on_stop_request(f"{message['stop_request']} on rank {source}")
            else:
                _, future = self.waiting.get(message["id"], (None, None))
                if future is None or future.done():
                    continue
                if "error" in message:
                    future.set_exception(RuntimeError(f"rank {source}: {message['error']}"))
                else:
                    future.set_result(message["output"])

    async def close(self) -> None:
        """Stop every engine rank; returns once `poll` has their last words."""
        self.closing = True
        for rank in range(1, self.size):
            self.sends.append(transport.isend(self.comm, {"stop": True}, rank, Tag.SERVE_REQUEST))
        while len(self.stopped) < self.size - 1:
            await asyncio.sleep(MIN_SLEEP_S * 20)
        for request in self.sends:
            transport.wait_sent(request)


async def serve_engine_rank(comm, local: LocalBackend, signalled: Callable[[], str | None]) -> None:
    """Ranks 1..N-1: generate what rank 0 sends, concurrently, until rank 0 says stop."""
    sleeps = _Sleeps()
    running: dict[int, asyncio.Task] = {}
    sends: list = []
    asked_to_stop = False

    async def answer(call_id: int, request: Generation) -> None:
        try:
            reply = {"id": call_id, "output": await local.generate(request)}
        except Exception as error:  # this request fails at its caller; the rank serves on
            reply = {"id": call_id, "error": repr(error)}
        sends.append(transport.isend(comm, reply, 0, Tag.SERVE_REPLY))

    def finished(call_id: int, task: asyncio.Task) -> None:
        running.pop(call_id, None)
        if task.cancelled():  # rank 0 sent `cancel`: the engine has dropped the generation (or it never started)
            sends.append(transport.isend(comm, {"id": call_id, "cancelled": True, "dropped": True}, 0, Tag.SERVE_REPLY))

    while True:
        sends[:] = [request for request in sends if not request.test()[0]]
        reason = signalled()
        if reason is not None and not asked_to_stop:
            asked_to_stop = True
            sends.append(transport.isend(comm, {"stop_request": reason}, 0, Tag.SERVE_REPLY))
        found, message, _ = transport.try_recv(comm, 0, Tag.SERVE_REQUEST)
        if not found:
            await sleeps.sleep(busy=bool(running or sends))
            continue
        sleeps.reset()
        if "stop" in message:
            break
        if "cancel" in message:
            task = running.get(message["cancel"])
            if task is not None:
                task.cancel()  # `finished` confirms
            else:  # answered already: confirm all the same, rank 0 counts one confirmation per cancel
                late = {"id": message["cancel"], "cancelled": True, "dropped": False}
                sends.append(transport.isend(comm, late, 0, Tag.SERVE_REPLY))
            continue
        call_id = message["id"]
        running[call_id] = asyncio.ensure_future(answer(call_id, message["generation"]))
        running[call_id].add_done_callback(lambda task, call_id=call_id: finished(call_id, task))
    local.engine.abort_all()
    if running:
        await asyncio.wait(list(running.values()))
        await asyncio.sleep(0)  # their `finished` callbacks have run: every confirmation is in `sends`
    for request in sends:
        transport.wait_sent(request)
    transport.send(comm, {"stopped": True}, 0, Tag.SERVE_REPLY)
