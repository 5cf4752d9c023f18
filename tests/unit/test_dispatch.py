"""Dynamic task dispatch: the step queue's arithmetic, the dispatcher's answers (held, later, deferred), its
goodbyes at the end of a run, and a single-process run that claims its tasks from its own queue."""

import asyncio

import datasets
import pytest

from agentrl.data.tasks import DatasetTasks, SeededTasks
from agentrl.metrics import merge_stats
from agentrl.rollout import dispatch
from agentrl.rollout.dispatch import DispatchServer, StepQueue, default_groups_in_flight


def test_without_dynamic_sampling_the_queue_hands_out_exactly_the_steps_tasks():
    queue = StepQueue(target=5, budget=5)
    assert list(queue.take(2)) == [0, 1]
    assert list(queue.take(10)) == [2, 3, 4]
    assert not queue.take(1) and queue.closed
    queue.report(kept=5, dropped=0)
    assert queue.stats() == {"rollout/extra_rounds": 0.0, "rollout/groups_short": 0.0}


def test_dropped_groups_are_replaced_until_the_step_is_full_or_the_budget_is_spent():
    queue = StepQueue(target=4, budget=8)
    assert list(queue.take(4)) == [0, 1, 2, 3]
    assert not queue.take(1) and not queue.closed  # all 4 may still be kept: nothing more now
    queue.report(kept=1, dropped=2)
    assert list(queue.take(5)) == [4, 5]  # exactly the two that were dropped
    queue.report(kept=1, dropped=1)  # group 3 kept; 4 dropped -> one more
    queue.report(kept=0, dropped=1)  # 5 dropped
    assert list(queue.take(5)) == [6, 7]  # the budget (8 tasks) ends it
    assert queue.closed and not queue.take(1)
    queue.report(kept=1, dropped=1)
    assert queue.kept == 3 and queue.in_flight == 0
    assert queue.stats() == {"rollout/extra_rounds": 1.0, "rollout/groups_short": 1.0}


def test_default_groups_in_flight_is_half_a_share():
    assert default_groups_in_flight(16, 2) == 4
    assert default_groups_in_flight(5, 2) == 2
    assert default_groups_in_flight(2, 4) == 1


class Sent(list):
    """transport.send stand-in: the dispatcher's answers to peers, in order."""

    def __call__(self, comm, obj, dest, tag):
        self.append((dest, obj))


@pytest.fixture
def sent(monkeypatch):
    replies = Sent()
    monkeypatch.setattr(dispatch.transport, "send", replies)
    return replies


def rows(count):
    return datasets.Dataset.from_dict({"id": [f"r{i}" for i in range(count)], "prompt": ["?"] * count})


def claim(peer_step, want, running, kept=0, dropped=0):
    return {"step": peer_step, "want": want, "running": running, "kept": kept, "dropped": dropped}


def test_a_peer_with_nothing_in_flight_is_held_until_another_ranks_verdict_decides(sent):
    source = DatasetTasks(rows(20), "rows", 0, 0, 1)
    server = DispatchServer(None, [7], tasks_per_step=2, max_extra_rounds=2, source=source)
    server.open(0)

    async def rank0():
        tasks = await server.claim(0, 2, 0, 0, 0)
        server._handle(7, claim(0, want=1, running=0))  # the peer: nothing left to give, nothing running
        assert sent == []  # held, not told "later": it would have nothing to report with
        await server.finish(0, kept=1, dropped=1)  # rank 0's verdicts: one group dropped
        return tasks

    assert asyncio.run(rank0()) == [(0, 0), (1, 1)]  # task index, data position
    assert sent == [(7, [(2, 2)])]  # the held peer gets the replacement task and the next row
    server._handle(7, {"step": 0, "kept": 1, "dropped": 0, "finished": True})
    assert server.finished == {7} and server.queue.closed and source.consumed == 3


def test_a_peer_with_groups_running_is_told_later_and_done_once_the_step_closes(sent):
    server = DispatchServer(None, [5], tasks_per_step=2, max_extra_rounds=1, source=SeededTasks(0))
    server.open(3)
    server._handle(5, claim(3, want=4, running=0))
    server._handle(5, claim(3, want=2, running=2))
    server._handle(5, claim(3, want=1, running=1, kept=1))
    server._handle(5, claim(3, want=2, running=0, kept=1))
    assert sent == [(5, [(0, None), (1, None)]), (5, None), (5, None), (5, [])]


def test_claims_for_a_later_step_wait_until_rank_0_opens_it(sent):
    server = DispatchServer(None, [5, 6], tasks_per_step=4, max_extra_rounds=0, source=SeededTasks(0))
    server.open(0)
    server._handle(6, claim(1, want=2, running=0))  # running ahead
    assert sent == [] and len(server.later) == 1
    server.open(1)
    assert sent == [(6, [(0, None), (1, None)])] and not server.later


def test_a_peer_that_says_goodbye_mid_step_gets_nothing_more_and_no_longer_holds_the_step_open(sent):
    server = DispatchServer(None, [5, 6], tasks_per_step=1, max_extra_rounds=1, source=SeededTasks(0))
    server.open(0)
    server._handle(6, claim(0, want=1, running=0))  # the step's one task
    server._handle(5, claim(0, want=1, running=0))  # held: group 0 may still be dropped
    server._handle(5, claim(1, want=1, running=0))  # for the next step
    server._handle(5, dispatch.GOODBYE)  # stopped between its claims and their answers
    assert sent == [(6, [(0, None)]), (5, dispatch.GOODBYE)] and not server.held and not server.later
    server._handle(6, {"step": 0, "kept": 0, "dropped": 1, "finished": True})  # a replacement is due...
    asyncio.run(server.serve())  # ...but no peer is left to claim it: serving ends
    assert sent[2:] == [] and server.gone == {5}


def test_closing_answers_every_waiting_claim_and_takes_each_peers_messages_until_its_goodbye(sent, monkeypatch):
    server = DispatchServer(None, [5, 6], tasks_per_step=1, max_extra_rounds=1, source=SeededTasks(0))
    server.open(0)
    server._handle(6, claim(0, want=1, running=0))
    server._handle(5, claim(0, want=1, running=0))  # held
    server._handle(6, claim(1, want=1, running=1))  # later
    incoming = [
        (claim(1, want=1, running=0), 5),  # sent before 5 saw the stop: told [] (nothing more)
        ({"step": 0, "kept": 0, "dropped": 1, "finished": True}, 6),  # needs no answer
        (dispatch.GOODBYE, 6),
        (dispatch.GOODBYE, 5),
    ]
    monkeypatch.setattr(dispatch.transport, "recv", lambda comm, source, tag: incoming.pop(0))
    server.close()
    assert sent[1:] == [(5, []), (6, []), (5, []), (6, dispatch.GOODBYE), (5, dispatch.GOODBYE)]
    assert not incoming and server.gone == {5, 6}


def test_rates_weigh_by_each_ranks_first_round_episodes_and_the_spread_is_logged():
    fast = {"time/rollout": 1.0, "rollout/generated_groups": 6.0, "rollout/success_rate": 0.5}
    slow = {"time/rollout": 1.5, "rollout/generated_groups": 2.0, "rollout/success_rate": 1.0}
    unweighted = merge_stats([fast, slow])
    assert unweighted["rollout/success_rate"] == 0.75
    assert unweighted["time/rollout_spread"] == 0.5 and unweighted["time/rollout"] == 1.5
    assert (unweighted["rollout/rank_groups_min"], unweighted["rollout/rank_groups_max"]) == (2.0, 6.0)
    fast["rollout/first_round_episodes"], slow["rollout/first_round_episodes"] = 12.0, 4.0
    assert merge_stats([fast, slow])["rollout/success_rate"] == pytest.approx((0.5 * 12 + 1.0 * 4) / 16)
