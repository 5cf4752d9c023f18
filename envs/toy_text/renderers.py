"""How each toy-text game reads as text: action names, the state drawn or described, how it ended.

A view reads the gymnasium env (unwrapped) and its observation; `view_for` picks the view by
the env's class, falling back to `StateNumberView` for any env with a Discrete observation space.
"""

from __future__ import annotations

import gymnasium as gym
from gymnasium import spaces
from gymnasium.envs.toy_text.blackjack import BlackjackEnv as GymBlackjack
from gymnasium.envs.toy_text.blackjack import sum_hand
from gymnasium.envs.toy_text.cliffwalking import CliffWalkingEnv as GymCliffWalking
from gymnasium.envs.toy_text.frozen_lake import FrozenLakeEnv as GymFrozenLake
from gymnasium.envs.toy_text.taxi import TaxiEnv as GymTaxi

TAXI_STOPS = ("R", "G", "Y", "B")  # the letters of taxi.locs, in index order
TAXI_IN_CAR = len(TAXI_STOPS)
BLACKJACK = 21


def decode_taxi(state: int) -> tuple[int, int, int, int]:
    """(taxi_row, taxi_col, passenger_location, destination) of a Taxi state; location 4 is "in the taxi"."""
    state, destination = divmod(int(state), 4)
    state, passenger = divmod(state, 5)
    row, col = divmod(state, 5)
    return row, col, passenger, destination


def draw_with_player(grid: list[list[str]], state) -> str:
    """The grid with P on the cell of a row-major `state`, and where that is."""
    row, col = divmod(int(state), len(grid[0]))
    grid[row][col] = "P"
    drawn = "\n".join("".join(cells) for cells in grid)
    return f"You are P at row {row + 1}, column {col + 1}.\n{drawn}"


class StateNumberView:
    """Any env with Discrete observations: the state as a number, actions as numbers."""

    action_names: tuple[str, ...] = ()

    def legend(self, game: gym.Env) -> str:
        """The rules and symbols, shown once at the start of an episode."""
        return f"{game.spec.id if game.spec else type(game.unwrapped).__name__}: choose actions that earn reward."

    def describe(self, game: gym.Env, state) -> str:
        """The current state, drawn or in words."""
        space = game.observation_space
        return f"You are in state {int(state) - space.start} of {space.n}."

    def succeeded(self, game: gym.Env, state, reward: float) -> bool:
        """Whether the game, just terminated in `state` with `reward`, was won."""
        return reward > 0

    def ending(self, game: gym.Env, state, reward: float) -> str:
        return f"The episode is over (last reward {reward:g})."

    def event(self, game: gym.Env, state, reward: float) -> str:
        """What just happened that the drawn state does not show; empty when nothing."""
        return ""


class FrozenLakeView(StateNumberView):
    action_names = ("left", "down", "right", "up")

    def describe(self, game: gym.Env, state) -> str:
        grid = [[cell.decode() for cell in row] for row in game.unwrapped.desc]
        return draw_with_player(grid, state)

    def legend(self, game: gym.Env) -> str:
        return "Frozen lake: walk to the goal G without falling into a hole H (F is ice, S the start)."

    def succeeded(self, game: gym.Env, state, reward: float) -> bool:
        return self._cell(game, state) == "G"

    def ending(self, game: gym.Env, state, reward: float) -> str:
        return "You reached the goal!" if self._cell(game, state) == "G" else "You fell into a hole."

    @staticmethod
    def _cell(game: gym.Env, state) -> str:
        desc = game.unwrapped.desc
        row, col = divmod(int(state), desc.shape[1])
        return desc[row, col].decode()


class TaxiView(StateNumberView):
    action_names = ("south", "north", "east", "west", "pickup", "dropoff")

    def describe(self, game: gym.Env, state) -> str:
        row, col, passenger, destination = decode_taxi(state)
        grid = [[cell.decode() for cell in line] for line in game.unwrapped.desc]
        grid[row + 1][2 * col + 1] = "T"  # the map has a border row and a wall-or-space column between cells
        drawn = "\n".join("".join(cells) for cells in grid)
        where = "in the taxi" if passenger == TAXI_IN_CAR else f"waiting at {TAXI_STOPS[passenger]}"
        return (
            f"You are T at row {row + 1}, column {col + 1}. The passenger is {where}; "
            f"take them to {TAXI_STOPS[destination]}.\n{drawn}"
        )

    def legend(self, game: gym.Env) -> str:
        return "Taxi: drive to the passenger, pick them up, and drop them off at their destination. Walls are |."

    def succeeded(self, game: gym.Env, state, reward: float) -> bool:
        _, _, passenger, destination = decode_taxi(state)
        return passenger == destination

    def ending(self, game: gym.Env, state, reward: float) -> str:
        return "The passenger is delivered!"


class CliffWalkingView(StateNumberView):
    action_names = ("up", "right", "down", "left")
    FELL_REWARD = -100

    def describe(self, game: gym.Env, state) -> str:
        env = game.unwrapped
        rows, cols = env.shape
        grid = [["."] * cols for _ in range(rows - 1)] + [["S"] + ["C"] * (cols - 2) + ["G"]]
        return draw_with_player(grid, state)

    def legend(self, game: gym.Env) -> str:
        return "Cliff walk: walk to the goal G; stepping on the cliff C sends you back to the start S."

    def event(self, game: gym.Env, state, reward: float) -> str:
        return "You fell off the cliff and are back at the start." if reward == self.FELL_REWARD else ""

    def succeeded(self, game: gym.Env, state, reward: float) -> bool:
        rows, cols = game.unwrapped.shape
        return int(state) == rows * cols - 1

    def ending(self, game: gym.Env, state, reward: float) -> str:
        return "You reached the goal!"


class BlackjackView(StateNumberView):
    action_names = ("stick", "hit")

    def describe(self, game: gym.Env, state) -> str:
        player_sum, dealer_card, usable_ace = (int(value) for value in state)
        cards = ", ".join(card_name(card) for card in game.unwrapped.player)
        ace = " with a usable ace" if usable_ace else ""
        return f"Your cards are {cards} (sum {player_sum}{ace}). The dealer shows {card_name(dealer_card)}."

    def legend(self, game: gym.Env) -> str:
        return "Blackjack: hit to take a card, stick to stop and let the dealer play; over 21 loses."

    def ending(self, game: gym.Env, state, reward: float) -> str:
        if sum_hand(game.unwrapped.player) > BLACKJACK:
            return "You went over 21 and lose."
        dealer = game.unwrapped.dealer
        result = "You win!" if reward > 0 else "You lose." if reward < 0 else "It is a draw."
        return f"The dealer has {', '.join(card_name(card) for card in dealer)} (sum {sum_hand(dealer)}). {result}"


def card_name(card: int) -> str:
    return "ace" if card == 1 else str(card)


VIEWS = (
    (GymFrozenLake, FrozenLakeView),
    (GymTaxi, TaxiView),
    (GymCliffWalking, CliffWalkingView),
    (GymBlackjack, BlackjackView),
)


def view_for(game: gym.Env) -> StateNumberView:
    """The view for `game`; ValueError when it has no view and no Discrete observation space."""
    for game_class, view_class in VIEWS:
        if isinstance(game.unwrapped, game_class):
            return view_class()
    if isinstance(game.observation_space, spaces.Discrete):
        return StateNumberView()
    raise ValueError(
        f"toy_text needs a Discrete observation space (or a game with a view in envs/toy_text/renderers.py); "
        f"{game.spec.id if game.spec else game} has {game.observation_space}"
    )
