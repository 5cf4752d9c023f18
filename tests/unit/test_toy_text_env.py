import gymnasium as gym
import pytest

from agentrl.env import make
from agentrl.env.check import check_env
from envs.toy_text import BlackjackEnv, CliffWalkingEnv, FrozenLakeEnv, TaxiEnv, ToyTextEnv, decode_taxi, parse_action

FROZEN_LAKE_ACTIONS = ("left", "down", "right", "up")
# the 4x4 map: SFFF / FHFH / FFFH / HFFG
SHORTEST_4X4_PATH = ["down", "down", "right", "right", "down", "right"]
TOY_TEXT_IDS = ["toy_text", "frozen_lake", "taxi", "cliff_walking", "blackjack"]


def test_parse_action_reads_names_case_insensitively_and_numbers():
    assert parse_action("RIGHT", FROZEN_LAKE_ACTIONS) == 2
    assert parse_action("I will go Up now", FROZEN_LAKE_ACTIONS) == 3
    assert parse_action("3", FROZEN_LAKE_ACTIONS) == 3
    assert parse_action(" 0\n", FROZEN_LAKE_ACTIONS) == 0


def test_parse_action_takes_the_first_mention_and_skips_out_of_range_numbers():
    assert parse_action("down, then left", FROZEN_LAKE_ACTIONS) == 1
    assert parse_action("1 or right", FROZEN_LAKE_ACTIONS) == 1
    assert parse_action("7 then left", FROZEN_LAKE_ACTIONS) == 0
    assert parse_action("5", ("a", "b"), count=6) == 5


def test_parse_action_rejects_junk_and_parts_of_words():
    for junk in ["", "banana", "leftover", "upward", "x2", "9", "-"]:
        assert parse_action(junk, FROZEN_LAKE_ACTIONS) is None, junk


def test_shortest_path_solves_non_slippery_4x4():
    env = FrozenLakeEnv()
    observation, _ = env.reset(seed=0)
    assert "P" in observation and "left, down, right, up" in observation
    for action in SHORTEST_4X4_PATH:
        observation, reward, terminated, truncated, info = env.step(action)
    assert terminated and not truncated
    assert reward == 1.0 and info["success"]
    assert "reached the goal" in observation


def test_walking_into_a_hole_fails_without_reward():
    env = FrozenLakeEnv()
    env.reset(seed=0)
    env.step("right")
    observation, reward, terminated, _, info = env.step("down")  # (1, 1) is a hole
    assert terminated and reward == 0.0 and not info["success"]
    assert "hole" in observation


def test_digits_move_like_names():
    by_name, by_number = FrozenLakeEnv(), FrozenLakeEnv()
    by_name.reset(seed=0)
    by_number.reset(seed=0)
    for action in SHORTEST_4X4_PATH[:3]:
        named = by_name.step(action)
        numbered = by_number.step(str(FROZEN_LAKE_ACTIONS.index(action)))
        assert named == numbered


def test_invalid_action_answers_with_the_legal_actions_and_keeps_the_state():
    env = FrozenLakeEnv()
    first, _ = env.reset(seed=0)
    observation, reward, terminated, truncated, info = env.step("jump over the hole")
    assert observation.startswith("Invalid action")
    assert "left, down, right, up" in observation
    assert info["invalid_action"] and not info["success"]
    assert reward == 0.0 and not terminated and not truncated
    assert env.state == 0
    assert "\n".join(first.splitlines()[1:6]) in observation  # the unchanged grid is shown again


def test_max_invalid_ends_the_episode():
    env = FrozenLakeEnv(max_invalid=2)
    env.reset(seed=0)
    assert env.step("??")[3] is False
    observation, _, terminated, truncated, info = env.step("??")
    assert truncated and not terminated and info["invalid_actions"] == 2
    assert "Too many invalid actions" in observation


def test_max_steps_truncates_and_step_after_the_end_raises():
    env = FrozenLakeEnv(max_steps=3)
    env.reset(seed=0)
    env.step("left")
    env.step("up")
    _, _, terminated, truncated, info = env.step("left")
    assert truncated and not terminated and not info["success"]
    with pytest.raises(RuntimeError, match="call reset"):
        env.step("left")


def test_step_before_reset_raises():
    with pytest.raises(RuntimeError, match="call reset"):
        TaxiEnv().step("south")


def test_shaping_rewards_are_added_only_when_asked():
    plain, shaped = FrozenLakeEnv(), FrozenLakeEnv(step_reward=0.1, invalid_reward=-0.2)
    for env in (plain, shaped):
        env.reset(seed=0)
    assert plain.step("down")[1] == 0.0
    assert shaped.step("down")[1] == pytest.approx(0.1)
    assert shaped.step("nonsense")[1] == pytest.approx(-0.2)


@pytest.mark.parametrize("env_class", [FrozenLakeEnv, TaxiEnv, CliffWalkingEnv, BlackjackEnv])
def test_seeding_is_reproducible(env_class):
    def play(seed):
        env = env_class(**({"is_slippery": True} if env_class in (FrozenLakeEnv, CliffWalkingEnv) else {}))
        transcript = [env.reset(seed=seed)[0]]
        for action in ["1", "0", "2", "1", "3", "0"]:
            if env.over:
                break
            transcript.append(env.step(action)[:2])
        return transcript

    assert play(7) == play(7)
    if env_class in (TaxiEnv, BlackjackEnv):  # their start states are random; the lake and cliff always start at S
        assert any(play(seed) != play(7) for seed in range(8))


def test_random_maps_follow_the_seed():
    env = FrozenLakeEnv(random_map_size=5)
    first = env.reset(seed=3)[0]
    assert FrozenLakeEnv(random_map_size=5).reset(seed=3)[0] == first
    assert any(env.reset(seed=seed)[0] != first for seed in range(4, 10))
    assert len([line for line in first.splitlines() if len(line) == 5 and set(line) <= set("SFHGP")]) == 5


def test_taxi_decode_matches_gymnasium():
    game = gym.make("Taxi-v4").unwrapped
    for state in range(game.observation_space.n):
        assert decode_taxi(state) == tuple(game.decode(state))


def test_taxi_draws_the_taxi_and_names_the_stops():
    env = TaxiEnv()
    observation, info = env.reset(seed=4)
    row, col, passenger, destination = decode_taxi(info["state"])
    assert f"row {row + 1}, column {col + 1}" in observation
    assert observation.splitlines()[3 + row][1 + 2 * col] == "T"
    assert f"waiting at {'RGYB'[passenger]}; take them to {'RGYB'[destination]}" in observation


def test_taxi_pickup_and_dropoff_succeeds():
    env = TaxiEnv()
    _, info = env.reset(seed=0)
    game = env.game.unwrapped
    # drive by gymnasium's own transition table: breadth-first search to the delivered state
    path = shortest_actions(game, info["state"], lambda s: decode_taxi(s)[2] == decode_taxi(s)[3])
    for action in path:
        observation, reward, terminated, _, step_info = env.step(env.view.action_names[action])
    assert terminated and reward == 20.0 and step_info["success"]
    assert "delivered" in observation


def shortest_actions(game, start, is_goal):
    frontier, seen = [(start, [])], {start}
    while frontier:
        state, path = frontier.pop(0)
        for action, outcomes in game.P[state].items():
            _, next_state, _, terminated = outcomes[0]
            if terminated and is_goal(next_state):
                return [*path, action]
            if next_state not in seen:
                seen.add(next_state)
                frontier.append((next_state, [*path, action]))
    raise AssertionError("no path to the goal")


def test_cliff_walking_fall_and_goal():
    env = CliffWalkingEnv()
    env.reset(seed=0)
    observation, reward, terminated, _, _ = env.step("right")
    assert reward == -100.0 and not terminated and "fell off the cliff" in observation
    for action in ["up"] + ["right"] * 11 + ["down"]:
        observation, reward, terminated, _, info = env.step(action)
    assert terminated and info["success"] and "reached the goal" in observation


def test_blackjack_success_is_a_win():
    outcomes = set()
    for seed in range(40):
        env = BlackjackEnv()
        env.reset(seed=seed)
        observation, reward, terminated, _, info = env.step("stick")
        assert terminated and info["success"] == (reward > 0)
        assert "dealer has" in observation
        outcomes.add(reward)
    assert {-1.0, 1.0} <= outcomes


class Chain(gym.Env):
    """Five states in a row; action 1 steps right, action 0 stays; the last state pays 1."""

    observation_space = gym.spaces.Discrete(5)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.position = 0
        return self.position, {}

    def step(self, action):
        self.position += int(action)
        done = self.position == 4
        return self.position, float(done), done, False, {}


def test_generic_game_without_a_view_uses_the_state_number():
    gym.register("ToyTextTestChain-v0", entry_point=Chain)
    env = ToyTextEnv("ToyTextTestChain-v0", max_steps=10)
    observation, _ = env.reset(seed=0)
    assert "state 0 of 5" in observation and "0-1" in observation
    observation, *_ = env.step("1")
    assert "state 1 of 5" in observation
    for _ in range(3):
        observation, reward, terminated, _, info = env.step("1")
    assert terminated and reward == 1.0 and info["success"]


def test_unknown_game_says_how_to_fix_it():
    with pytest.raises(ValueError, match="registered gymnasium id"):
        ToyTextEnv("NoSuchGame-v0")
    with pytest.raises(ValueError, match="game_kwargs"):
        ToyTextEnv("Taxi-v4", {"slippery": True})
    with pytest.raises(ValueError, match="needs a Discrete observation space"):
        ToyTextEnv("CartPole-v1")


@pytest.mark.parametrize("env_id", TOY_TEXT_IDS)
def test_check_env_passes(env_id):
    assert check_env(env_id, {}) == []
    assert isinstance(make(env_id), ToyTextEnv)


def test_progress_shaping_telescopes_to_the_distance_gained():
    env = FrozenLakeEnv(progress_reward=0.1)
    env.reset(seed=0)
    rewards = [env.step(action)[1] for action in ["down", "up", *SHORTEST_4X4_PATH]]
    assert rewards[:2] == pytest.approx([0.1, -0.1])
    assert sum(rewards) == pytest.approx(1.0 + 0.1 * 6)  # the goal's 1 plus six steps closer
    assert all(type(reward) is float for reward in rewards)


def test_brief_lists_the_actions_only_at_the_start_and_after_invalid_answers():
    env = FrozenLakeEnv(brief=True)
    assert "Actions:" in env.reset(seed=0)[0]
    moved = env.step("down")[0]
    assert "Actions:" not in moved and "row 2, column 1" in moved
    assert "left, down, right, up" in env.step("what")[0]
    full = FrozenLakeEnv()
    full.reset(seed=0)
    assert "Actions:" in full.step("down")[0]
