"""An episode's env costs no metadata scan: plug-ins resolve once, env classes describe their tools once, and the
Gymnasium spaces of a text env are made only when asked for."""

from importlib.metadata import EntryPoint

import pytest

from agentrl import plugins
from agentrl.env.api import FreeText, TextEnv
from agentrl.env.tools import ToolEnv, class_tools, tool
from agentrl.plugins import Registry


class _Counting:
    """importlib.metadata.entry_points, counting its scans; `installed` is what the scan finds."""

    def __init__(self, installed: list[EntryPoint]):
        self.installed, self.scans = installed, 0

    def __call__(self, group: str):
        self.scans += 1
        return [ep for ep in self.installed if ep.group == group]


@pytest.fixture
def scan(monkeypatch):
    counting = _Counting([EntryPoint("first", "envs.guess_number:GuessNumberEnv", "test.group")])
    monkeypatch.setattr(plugins, "entry_points", counting)
    return counting


def test_an_entry_point_name_is_scanned_for_once_however_often_it_resolves(scan):
    registry = Registry("env id", "test.group", "register")
    found = [registry.resolve("first") for _ in range(50)]
    assert scan.scans == 1
    assert all(target is found[0] for target in found)
    assert found[0].__name__ == "GuessNumberEnv"


def test_a_package_installed_while_the_process_runs_is_found_by_one_rescan(scan):
    registry = Registry("env id", "test.group", "register")
    registry.resolve("first")
    scan.installed.append(EntryPoint("later", "envs.calculator:CalculatorEnv", "test.group"))
    assert registry.resolve("later").__name__ == "CalculatorEnv"
    assert scan.scans == 2


def test_an_unknown_name_still_lists_the_known_ones(scan):
    registry = Registry("env id", "test.group", "register")
    with pytest.raises(KeyError, match=r"unknown env id 'frist' \(did you mean 'first'\?\)"):
        registry.resolve("frist")


def test_registering_a_name_again_replaces_what_it_resolved_to(scan):
    registry = Registry("env id", "test.group", "register", overwrite=True)
    registry.register("mine", "envs.guess_number:GuessNumberEnv")
    assert registry.resolve("mine").__name__ == "GuessNumberEnv"
    registry.register("mine", "envs.calculator:CalculatorEnv")
    assert registry.resolve("mine").__name__ == "CalculatorEnv"


class _Adder(ToolEnv):
    @tool
    def add(self, a: int, b: int) -> str:
        """Add two numbers.

        Args:
            a: the first
            b: the second
        """
        return str(a + b)


def test_tools_are_described_once_per_class_and_each_instance_owns_its_list():
    class_tools.cache_clear()
    first, second = _Adder(), _Adder()
    assert class_tools.cache_info().misses == 1 and class_tools.cache_info().hits == 1
    assert first.tools == second.tools and first.tools is not second.tools
    first.add_tool(lambda_tool)
    assert [t["function"]["name"] for t in second.tools] == ["add"]
    assert [t["function"]["name"] for t in first.tools] == ["add", "lambda_tool"]


def lambda_tool(x: str) -> str:
    """Echo."""
    return x


def test_a_text_envs_spaces_are_made_when_asked_for_and_can_be_replaced():
    env = TextEnv()
    assert "observation_space" not in vars(env)
    assert isinstance(env.observation_space, FreeText) and env.observation_space is env.observation_space
    assert env.observation_space.contains("any text")
    env.action_space = FreeText(max_length=5)
    assert not env.action_space.contains("longer than five")
    assert TextEnv().action_space.contains("longer than five")
