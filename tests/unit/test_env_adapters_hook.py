"""`ADAPTER:NAME` env ids: an adapter registered for a prefix makes every environment of its package."""

import pytest

from agentrl.env import TextEnv, make, register_adapter
from agentrl.env.registry import registered_adapters


class _Named(TextEnv):
    def __init__(self, name: str, size: int = 1):
        self.name, self.size = name, size

    def reset(self, *, seed=None, options=None):
        return f"{self.name} x{self.size}", {}

    def step(self, action):
        return "", 1.0, True, False, {}


def test_an_adapter_prefix_makes_the_named_environment_with_its_kwargs():
    register_adapter("testpkg", _Named)
    env = make("testpkg:countdown", size=3)
    assert (env.name, env.size) == ("countdown", 3)
    assert env.reset()[0] == "countdown x3"
    assert "testpkg" in registered_adapters()


def test_a_module_path_whose_module_is_not_an_adapter_still_loads_as_before():
    env = make("envs.guess_number:GuessNumberEnv")
    assert type(env).__name__ == "GuessNumberEnv"


def test_an_unknown_id_names_the_known_ones():
    with pytest.raises(KeyError, match="unknown env id 'nosuchpkg'"):
        make("nosuchpkg")
