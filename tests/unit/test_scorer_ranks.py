"""Scorer ranks (layout.scorer): the layout places them, the config refuses combinations that would leave them idle
or a judge without a place to run, and a scorer rank's server answers a rollout rank's client over real MPI
messages (this process talking to itself): scores as in-process, cached, failures with the reason, the last word
after goodbye; and a client whose scorer never answers fails its episodes instead of waiting for ever. The judge
run by the engine (reward.judge.path) is a tiny model taught to answer `Score: 7`."""

from __future__ import annotations

import asyncio
import threading

import pytest

from agentrl.config import ConfigError, LayoutConfig, from_dict
from agentrl.config.schema import JudgeConfig, RewardConfig, RewardModelConfig
from agentrl.layout import Role, assign_roles, bind_gpus
from agentrl.scoring import ModelScorer, ScoreFailed
from agentrl.scoring.remote import RemoteScorer
from agentrl.transport import Tag

RUBRIC = "Rate the reply from 0 to 9.\nReply: {completion}"


def test_scorer_ranks_come_last_and_take_gpus():
    layout = LayoutConfig(trainer=1, rollout=2, env=1, scorer=1)
    roles = assign_roles(layout, 5)
    assert roles == [Role.TRAINER, Role.ROLLOUT, Role.ROLLOUT, Role.ENV, Role.SCORER]
    assert bind_gpus(roles, [0] * 5, gpus_per_node=4) == [0, 1, 2, None, 3]
    with pytest.raises(ConfigError, match=r"env=1 \+ scorer=1\) but the job has 4; launch with `mpirun -n 5`"):
        assign_roles(layout, 4)


def judge(**fields) -> dict:
    return {"rubric": RUBRIC, **fields}


@pytest.mark.parametrize(
    ("config", "fix"),
    [
        ({"reward": {"judge": judge()}}, "reward.judge needs exactly one of base_url"),
        (
            {"reward": {"judge": judge(base_url="http://h/v1", path="j", model="m")}},
            "reward.judge needs exactly one of base_url (an OpenAI-compatible endpoint) and path",
        ),
        ({"reward": {"judge": judge(base_url="http://h/v1")}}, "reward.judge.base_url needs reward.judge.model"),
        ({"reward": {"judge": judge(path="j", retries=2)}}, "reward.judge.retries is for an endpoint (base_url)"),
        ({"reward": {"judge": judge(path="j", model="m")}}, "remove reward.judge.model"),
        (
            {"reward": {"judge": judge(base_url="http://h/v1", model="m", dtype="bfloat16")}},
            "remove reward.judge.dtype",
        ),
        ({"layout": {"scorer": 1}}, "layout.scorer=1 ranks serve a scoring model, but the run loads none; set"),
        (
            {"layout": {"scorer": 2}, "reward": {"judge": judge(base_url="http://h/v1", model="m")}},
            "or layout.scorer=0 (reward.judge.base_url's endpoint is the judge already)",
        ),
    ],
)
def test_combinations_that_cannot_run_are_refused_with_the_fix(config, fix):
    with pytest.raises(ConfigError) as error:
        from_dict({"model": {"path": "m"}, **config})
    assert fix in str(error.value)


def test_a_judge_path_or_a_reward_model_may_have_scorer_ranks():
    config = from_dict({"model": {"path": "m"}, "layout": {"scorer": 2}, "reward": {"judge": judge(path="j")}})
    assert config.layout.world_size == 4 and config.reward.loads_a_model
    assert config.reward.scorer_name == "reward.judge (j)"
    assert from_dict(config.model_dump(mode="json")).reward.judge.path == "j"  # as saved in run_dir/config.yaml
    config = from_dict({"model": {"path": "m"}, "layout": {"scorer": 1}, "reward": {"model": {"path": "rm"}}})
    assert config.reward.scorer_name == "reward.model (rm)"


@pytest.fixture(scope="module")
def reward_model_dir(tmp_path_factory):
    from tests.unit.test_reward_model import build_reward_model

    return build_reward_model(tmp_path_factory.mktemp("reward_model"))


@pytest.fixture(scope="module")
def judge_dir(tmp_path_factory):
    from tests.unit.tiny_judge import build_tiny_judge

    return build_tiny_judge(tmp_path_factory.mktemp("judge"))


def episode(reply: str) -> dict:
    return {"task": "Guess", "completion": reply, "transcript": [(reply, "higher")], "answer": "5", "finish": "x"}


class SelfServed:
    """A ScoreServer for this process's own rank on a duplicate of COMM_SELF, running in a thread, and a
    RemoteScorer to it: both ends of the wire in one process."""

    def __init__(self, config: RewardConfig):
        from mpi4py import MPI

        from agentrl.roles.scorer import ScoreServer

        self.comm = MPI.COMM_SELF.Dup()
        self.scorer = ModelScorer(config)
        self.server = ScoreServer(self.comm, self.scorer, [0])
        self.thread = threading.Thread(target=asyncio.run, args=(self.server.run(),), daemon=True)
        self.thread.start()
        self.client = RemoteScorer(self.comm, 0, config, timeout_s=60)

    def close(self) -> None:
        self.client.shutdown()
        self.thread.join(timeout=30)
        assert not self.thread.is_alive(), "the server did not end after the goodbye"
        self.comm.Free()


async def score_all(scorer, episodes: list[dict]) -> list:
    return await asyncio.gather(*(scorer.score(**e) for e in episodes), return_exceptions=True)


def test_a_scorer_rank_answers_as_in_process_with_its_cache_and_failures_with_the_reason(reward_model_dir):
    replies = ["It is 5.", "It is 6.", "No idea.", "It is 5.", "x" * 300]
    config = RewardConfig(model=RewardModelConfig(path=str(reward_model_dir), max_length=64, batch_wait_s=0.2))
    local = asyncio.run(score_all(ModelScorer(config), [episode(reply) for reply in replies]))
    served = SelfServed(config)
    try:
        first = asyncio.run(score_all(served.client, [episode(reply) for reply in replies]))
        again = asyncio.run(score_all(served.client, [episode(replies[1])]))[0]
    finally:
        served.close()
    for remote, own in zip(first[:4], local[:4], strict=True):
        assert remote.reward == pytest.approx(own.reward, rel=1e-4, abs=1e-5)
    assert [score.metrics["score_cached"] for score in first[:4]] == [0.0, 0.0, 0.0, 1.0]  # the 4th repeats the 1st
    assert again.reward == first[1].reward and again.metrics["score_cached"] == 1.0
    assert isinstance(first[4], ScoreFailed) and "over reward.model.max_length=64" in str(first[4])
    counts = served.scorer.batcher.counts
    assert (counts.asked, counts.cached, counts.batches, counts.failed) == (6, 2, 1, 1)
    assert (served.server.counts.requests, served.server.counts.episodes) == (2, 6)  # one request per tick
    assert served.client.path == f"reward.model ({reward_model_dir}) on scorer rank 0"


def test_a_client_whose_scorer_never_answers_fails_its_episodes_with_the_reason():
    from mpi4py import MPI

    from agentrl import transport

    comm = MPI.COMM_SELF.Dup()
    config = RewardConfig(model=RewardModelConfig(path="unused"))
    client = RemoteScorer(comm, 0, config, timeout_s=0.3)
    taken = []  # a send to this same rank completes once it is received: a thread takes it as a scorer rank would
    taker = threading.Thread(target=lambda: taken.append(transport.recv(comm, 0, Tag.SCORE_REQUEST, timeout_s=30)))
    taker.start()
    try:
        failed = asyncio.run(score_all(client, [episode("a"), episode("b")]))
        assert all(isinstance(result, ScoreFailed) for result in failed)
        assert "scorer rank 0 answered nothing for 0.3 s" in str(failed[0])
        taker.join(timeout=30)
        (request_id, sent), _ = taken[0]
        assert [arguments["completion"] for arguments in sent] == ["a", "b"]
        assert set(sent[0]) == {"task", "completion", "transcript", "answer"}  # never info or reset_info
        # a late reply, then the last word: the client takes both on its way out
        late = transport.isend(comm, (request_id, [(1.0, None, False)] * 2), 0, Tag.SCORE_REPLY)
        goodbye = threading.Thread(target=client.shutdown)
        goodbye.start()
        assert transport.recv(comm, 0, Tag.SCORE_REQUEST, timeout_s=5)[0] is None
        last_word = transport.isend(comm, None, 0, Tag.SCORE_REPLY)
        transport.wait_sent(late)
        transport.wait_sent(last_word)
        goodbye.join(timeout=10)
        assert not goodbye.is_alive()
        assert not transport.probe(comm, 0, Tag.SCORE_REPLY)  # nothing left unreceived
    finally:
        comm.Free()


class ReceiveBreaks:
    """The transport module as the client sees it, except that receiving raises: only the client's receive is
    broken, so the test's own thread, standing in for the scorer rank, still receives the request."""

    def __init__(self, transport):
        self.transport = transport

    def __getattr__(self, name):
        return getattr(self.transport, name)

    @staticmethod
    def try_recv(*args, **kwargs):
        raise RuntimeError("truncated message")


@pytest.mark.timeout(60)  # without the fix the later request's send waits for a receiver that never comes
def test_a_client_that_cannot_receive_fails_this_and_every_later_request_with_the_reason(monkeypatch):
    from mpi4py import MPI

    from agentrl import transport
    from agentrl.scoring import remote

    comm = MPI.COMM_SELF.Dup()
    monkeypatch.setattr(remote, "transport", ReceiveBreaks(transport))
    client = RemoteScorer(comm, 0, RewardConfig(model=RewardModelConfig(path="unused")), timeout_s=30)
    taken = []  # a send to oneself completes once received, so the scorer's side receives in a thread
    taker = threading.Thread(target=lambda: taken.append(transport.recv(comm, 0, Tag.SCORE_REQUEST, timeout_s=30)))
    taker.start()
    try:
        first = asyncio.run(asyncio.wait_for(score_all(client, [episode("a")]), 30))
        later = asyncio.run(asyncio.wait_for(score_all(client, [episode("b")]), 5))  # at once, never a hang
        taker.join(timeout=30)
        for result in (first[0], later[0]):
            assert isinstance(result, ScoreFailed)
            assert "receiving scores from scorer rank 0 raised RuntimeError('truncated message')" in str(result)
        (_, sent), _ = taken[0]
        assert [arguments["completion"] for arguments in sent] == ["a"]
        # the later request was failed here, not sent to a scorer nobody hears
        assert not transport.probe(comm, 0, Tag.SCORE_REQUEST)
    finally:
        comm.Free()


def test_a_judge_run_by_the_engine_scores_a_batch_in_one_generation(judge_dir):
    config = RewardConfig(
        judge=JudgeConfig(path=str(judge_dir), rubric=RUBRIC, score_range=(0, 9), max_tokens=8, batch_wait_s=0.2)
    )
    scorer = ModelScorer(config)
    scores = asyncio.run(score_all(scorer, [episode(reply) for reply in ["1", "25", "hello", "abc", "1"]]))
    assert [score.reward for score in scores] == [pytest.approx(7 / 9)] * 5
    assert scorer.judge.forwards == 1 and scorer.batcher.counts.batches == 1  # four distinct prompts, one batch
    assert scorer.path == f"reward.judge ({judge_dir})"


def test_a_judge_reply_without_a_score_fails_its_episode_with_the_reply(judge_dir):
    config = RewardConfig(judge=JudgeConfig(path=str(judge_dir), rubric=RUBRIC, score_range=(0, 9), max_tokens=3))
    failed = asyncio.run(score_all(ModelScorer(config), [episode("1")]))[0]
    assert isinstance(failed, ScoreFailed)
    assert "no score in the judge's reply" in str(failed) and "Reply: 'Score'" in str(failed)


def test_a_judge_on_a_scorer_rank_answers_the_rollout_rank(judge_dir):
    config = RewardConfig(judge=JudgeConfig(path=str(judge_dir), rubric=RUBRIC, score_range=(0, 9)), success_at=0.5)
    served = SelfServed(config)
    try:
        scores = asyncio.run(score_all(served.client, [episode("3"), episode("4")]))
    finally:
        served.close()
    assert [(score.reward, score.success) for score in scores] == [(pytest.approx(7 / 9), True)] * 2
