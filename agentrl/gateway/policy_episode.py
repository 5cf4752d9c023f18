"""One episode of an agent program on a multi-policy gateway: the agent calls each policy by model name in one
session, and each policy's calls become that policy's episode, with that policy's reward.

A policy's reward: what was posted for it (`/reward {"reward": x, "policy": NAME}`), else the session's own
(`/reward {"reward": x}` or the last stdout line `{"reward": x}`: every policy that acted gets it), plus the rewards
posted for its calls' turns (`/reward {"reward": x, "call": i}`: call i's policy). Its success likewise (posted
for it, else the session's, else its reward above 0). A policy the agent never called has no episode.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from agentrl.gateway.episode import failed, fill_episode, run_session, task_row
from agentrl.gateway.policy_router import unknown_model_message
from agentrl.gateway.trace import samples_from_calls
from agentrl.trajectory import Episode, RewardError, finite_reward


@dataclass
class PolicySession:
    """How one session went: each policy that acted, its filled episode (failed ones included) and its reward;
    the session's error (then every policy's episode failed), and the model names no policy had."""

    episodes: dict[str, Episode] = field(default_factory=dict)
    rewards: dict[str, float] = field(default_factory=dict)
    success: bool = False
    error: str | None = None
    unknown_models: list[str] = field(default_factory=list)


async def run_policy_session(gateway, agent, episodes: dict[str, Episode], sampling: dict, timers=None):
    """Run the agent once on a session of the task of `episodes` ({policy: its empty episode}, one task); fill the
    episode of each policy it called. On a failed run every policy's episode fails (counted, no signal)."""
    first = next(iter(episodes.values()))
    session, error, printed = await run_session(gateway, agent, task_row(first), timers, policy_sampling=sampling)
    known = list(episodes)
    if session.unknown_models and error is not None:  # the root cause of the crash it most likely led to
        error = f"{unknown_model_message(session.unknown_models[0], known)}; the agent then failed: {error}"
    result = PolicySession(unknown_models=list(session.unknown_models))
    if error is not None:
        result.error = error
        result.episodes = {name: failed(episode, error) for name, episode in episodes.items()}
        return result
    calls = session.calls
    for name, episode in episodes.items():
        own = [call for call in calls if call.policy == name]
        if not own:
            continue
        result.episodes[name] = episode
        try:
            reward, success = _policy_reward(session, name, printed)
        except RewardError as refused:
            failed(episode, f"{refused} (the episode failed and does not train)")
            continue
        if reward is None:
            failed(
                episode,
                f'the agent gave no reward for policy {name}: POST {{"reward": x, "policy": "{name}"}} (or '
                '{"reward": x} for every policy) to its session\'s /reward, or print {"reward": x} as its last '
                "stdout line",
            )
            continue
        fill_episode(episode, samples_from_calls(calls, name), own, session.turn_rewards, reward, success)
        episode.text = "\n".join(f">>> {call.text}" for call in own)
        result.rewards[name] = reward
    outcome = session.success if session.success is not None else printed[1]
    result.success = bool(outcome) if outcome is not None else all(e.success for e in result.episodes.values())
    return result


def _policy_reward(session, name: str, printed: tuple) -> tuple[float | None, bool | None]:
    """Policy `name`'s reward and success in `session`: its own posted outcome, else the session's (posted, else
    printed), plus the rewards posted for its calls' turns; (None, ...) without any."""
    session_reward, session_success = (session.reward, session.success) if session.reward is not None else printed
    outcome = session.policy_rewards.get(name, session_reward)
    success = session.policy_success.get(name, session_success)
    turns = [reward for call, reward in session.turn_rewards.items() if session.calls[call].policy == name]
    if not turns:
        return outcome, success
    total = sum(turns) + (outcome or 0.0)
    return finite_reward(total, f"policy {name}'s reward (its turns' rewards and its outcome, summed)"), success
