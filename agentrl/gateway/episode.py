"""One episode of an agent program: open a session, let the agent run (a command, or a service that claims
the session), then turn the session's calls into the episode's samples and reward."""

from __future__ import annotations

import asyncio
import time

from agentrl.gateway.agent_host import run_agent_remotely
from agentrl.gateway.agent_process import run_agent
from agentrl.gateway.trace import samples_from_calls
from agentrl.scoring import ScoreFailed
from agentrl.trajectory import Episode, RewardError, finite_reward


async def run_agent_episode(
    gateway, agent, episode: Episode, sampling, reward_fn=None, timers=None, env_client=None
) -> Episode:
    """Fill `episode` from one run of the agent (`agent`: the config's AgentConfig), its command started here or,
    with `env_client` (layout.env), on that env rank (agentrl/gateway/agent_host.py). A run that crashes, passes
    agent.timeout_s, never calls the model, ends without a reward or gives one that is not a finite number (the
    gateway refused it, or it printed one) fails: counted in episode/failed, no training signal.
    The samples after the first are in `episode.more_samples`."""
    task = task_row(episode)
    session, error, printed = await run_session(gateway, agent, task, timers, sampling=sampling, env_client=env_client)
    calls = session.calls
    if error is not None:
        return failed(episode, error)
    samples = samples_from_calls(calls)
    try:
        reward, success = _reward(session, printed)
    except RewardError as refused:
        return failed(episode, f"{refused} (the episode failed and does not train)")
    transcript = _transcript(calls)
    if reward_fn is not None:
        try:
            score = await reward_fn.score(
                completion=transcript[-1][0] if transcript else "",
                task=task.get("prompt") or task.get("question") or "",
                answer=task.get("answer"),
                transcript=transcript,
                env_reward=reward or 0.0,
                info={},
                reset_info=task,
                finish="terminated",
            )
            reward = reward_fn.combine(reward or 0.0, score)
        except RewardError as refused:
            return failed(episode, f"{refused} (the episode failed and does not train)")
        except ScoreFailed as failure:
            return failed(episode, f"{reward_fn.path}: {failure}")
        except Exception as exception:  # user code: the episode fails, the run goes on
            return failed(episode, f"reward_fn {reward_fn.path} raised: {exception!r}")
        success = score.success if score.success is not None else success
    if reward is None:
        return failed(
            episode,
            'the agent gave no reward: POST {"reward": x} to its session\'s /reward, print {"reward": x} as its '
            "last stdout line, or set env.reward_fn (or reward.judge, reward.model) to score the transcript",
        )
    if reward_fn is not None:
        episode.add_metrics(score.metrics)
    fill_episode(episode, samples, calls, session.turn_rewards, reward, success)
    episode.text = "\n".join(f">>> {reply}" for reply, _ in transcript)
    return episode


async def run_session(gateway, agent, task: dict, timers=None, sampling=None, policy_sampling=None, env_client=None):
    """One run of the agent (a command started here or, with `env_client`, on that env rank; or a service that
    claims the session) on a session of its own for `task`,
    every call sampled with `sampling` (or, on a multi-policy gateway, its policy's in `policy_sampling`):
    (the closed session, why the run failed or None, the (reward, success) its last stdout line printed)."""
    session = gateway.table.open(task)
    session.sampling = sampling
    session.policy_sampling = dict(policy_sampling or {})
    started = time.perf_counter()
    try:
        if agent.command is not None and env_client is not None:
            run = await run_agent_remotely(env_client, session.id, task, session.base_url, session.key)
            error, printed = run.error, (run.reward, run.success)
        elif agent.command is not None:
            run = await run_agent(agent.command, task, session.base_url, session.key, agent.timeout_s, cwd=agent.cwd)
            error, printed = run.error, (run.reward, run.success)
        else:
            gateway.table.offer(session)
            error = await _service_run(session, agent)
            printed = (None, None)
    finally:
        gateway.table.close(session)
        if timers is not None:
            timers.env += time.perf_counter() - started  # the agent's own time, the model's calls included
    if session.refused is not None:  # the root cause, before the crash or hang it may have led to
        error = session.refused
    if error is None and not session.calls:
        error = "the agent never called the model (no chat or completion request reached its session URL)"
    return session, error, printed


def fill_episode(episode: Episode, samples: list, calls: list, turn_rewards: dict, reward: float, success) -> None:
    """`episode` (and its `more_samples`) from the session's `samples` of `calls`, with the episode's reward and
    success (None: the reward is above 0)."""
    first, *more = samples
    _fill(episode, first, turn_rewards)
    episode.reward, episode.success = float(reward), bool(success) if success is not None else reward > 0
    episode.finish = "terminated"
    episode.turns = len(calls)
    episode.add_metrics({"tool_calls": sum(call.tool_calls for call in calls)})
    episode.weight_version = min(call.weight_version for call in calls)
    episode.messages = _messages(calls)
    episode.more_samples = []
    for index, sample in enumerate(more, start=1):
        extra = Episode(group=episode.group, task_seed=episode.task_seed, task_id=episode.task_id, sample=index)
        _fill(extra, sample, turn_rewards)
        extra.reward, extra.success, extra.finish = episode.reward, episode.success, episode.finish
        extra.turns, extra.weight_version = sample.calls, episode.weight_version
        episode.more_samples.append(extra)


async def _service_run(session, agent) -> str | None:
    """Wait for a service to claim the session (agent.claim_timeout_s: sessions queue while the service is busy),
    then for it to end the session (agent.timeout_s from the claim); why the run failed, or None."""
    try:
        await asyncio.wait_for(session.claimed.wait(), agent.claim_timeout_s)
    except asyncio.TimeoutError:
        return (
            f"no agent service claimed session {session.id} within agent.claim_timeout_s={agent.claim_timeout_s:g} s; "
            "is the service running, and reading this run's run_dir/gateway/?"
        )
    try:
        await asyncio.wait_for(session.ended.wait(), agent.timeout_s)
    except asyncio.TimeoutError:
        return f"the agent service did not end session {session.id} within agent.timeout_s={agent.timeout_s:g} s"
    return None


def task_row(episode: Episode) -> dict:
    """What the agent gets as its task: the dataset row, or the seed of a seeded task."""
    if episode.task_options:
        return dict(episode.task_options)
    return {"seed": episode.task_seed, "id": episode.task_id}


def failed(episode: Episode, error: str) -> Episode:
    episode.finish, episode.error, episode.reward = "error", error, 0.0
    episode.more_samples = []
    if not episode.tokens:
        episode.extend([0], mask=0)
    return episode


def _fill(episode: Episode, sample, turn_rewards: dict) -> None:
    """`sample`'s tokens and turns into `episode`; each turn's reward is the one posted for its call (0 if none)."""
    episode.tokens, episode.loss_mask = sample.tokens, sample.loss_mask
    episode.logprobs, episode.token_versions = sample.logprobs, sample.token_versions
    episode.prompt_len, episode.turn_spans = sample.prompt_len, sample.turn_spans
    episode.turn_calls = list(sample.call_indices)
    episode.turn_rewards = [turn_rewards.get(call, 0.0) for call in sample.call_indices]
    episode.turn_states = [0] * len(sample.turn_spans)


def _reward(session, printed: tuple) -> tuple[float | None, bool | None]:
    """The episode's reward and success: the session's posted reward, else the last stdout line's (the outcome),
    plus the rewards posted for its calls' turns. None without either."""
    outcome, success = (session.reward, session.success) if session.reward is not None else printed
    if not session.turn_rewards:
        return outcome, success
    total = sum(session.turn_rewards.values()) + (outcome or 0.0)
    return finite_reward(total, "the episode's reward (its turns' rewards and its outcome, summed)"), success


def _transcript(calls) -> list[tuple[str, str]]:
    """(reply text, next user or tool message) per call, for reward functions."""
    out = []
    for index, call in enumerate(calls):
        reply = call.text
        following = ""
        if index + 1 < len(calls):
            messages = getattr(calls[index + 1].request, "messages", None) or []
            if messages:
                content = messages[-1].content
                following = content if isinstance(content, str) else ""
        out.append((reply, following))
    return out


def _messages(calls) -> list[dict]:
    request = getattr(calls[-1], "request", None)
    messages = [m.model_dump(exclude_none=True) for m in getattr(request, "messages", None) or []]
    reply = calls[-1].reply or {"role": "assistant", "content": calls[-1].text}
    return [*messages, {key: value for key, value in reply.items() if value is not None}]
