"""The rule that stops a run whose steps only fail: counted by error kind over the whole step."""

import pytest

from agentrl.config import ConfigError, load_config
from agentrl.rollout.failures import FailureTally, StepFailed, abort_if_failing, error_kind
from agentrl.trajectory import Episode


def episodes(*errors: str | None) -> list[Episode]:
    return [Episode(group=0, task_seed=i, error=error) for i, error in enumerate(errors)]


def fault(seed: int) -> str:
    return f"env step failed: RuntimeError: injected fault for seed {seed}\nTraceback ..."


def test_tally_counts_kinds_over_the_parts_of_a_step():
    first = FailureTally.of(episodes(fault(1), None, fault(2)))
    second = FailureTally.of(episodes(fault(3), "reward_fn raised:\nKeyError"))
    whole = FailureTally.merged([first, second])
    assert whole.episodes == 5
    assert whole.kinds == {error_kind(fault(1)): (3, fault(1)), "reward_fn raised:": (1, "reward_fn raised:\nKeyError")}


def test_a_step_where_every_episode_failed_alike_stops_the_run(capsys):
    tally = FailureTally.of(episodes(fault(1), fault(2), fault(3)))
    with pytest.raises(StepFailed, match=r"step 4: 3 of 3 episodes failed with the same error"):
        abort_if_failing(4, tally, 1.0)
    printed = capsys.readouterr().err
    assert "runtime.abort_on_failed_fraction=1.0" in printed and fault(1) in printed
    assert printed.count("injected fault") == 1  # the first error, not all of them


def test_contained_faults_and_mixed_errors_do_not_stop_it():
    abort_if_failing(0, FailureTally.of(episodes(fault(1), fault(2), None)), 1.0)  # one episode succeeded
    abort_if_failing(0, FailureTally.of(episodes(fault(1), "timed out", "timed out")), 1.0)  # not the same error
    abort_if_failing(0, FailureTally.of(episodes(None, None)), 1.0)
    abort_if_failing(0, FailureTally.of(episodes(fault(1), fault(2))), None)  # null: never


def test_a_lower_fraction_stops_it_sooner():
    tally = FailureTally.of(episodes(fault(1), fault(2), None, "other"))
    with pytest.raises(StepFailed):
        abort_if_failing(0, tally, 0.5)
    abort_if_failing(0, tally, 0.75)


@pytest.mark.parametrize("value", ["0", "1.5", "-1"])
def test_the_fraction_is_validated(value):
    with pytest.raises(ConfigError, match=r"runtime.abort_on_failed_fraction: must be a fraction in \(0, 1\]"):
        load_config(None, ["model.path=x", f"runtime.abort_on_failed_fraction={value}"])
    assert (
        load_config(None, ["model.path=x", "runtime.abort_on_failed_fraction=null"]).runtime.abort_on_failed_fraction
        is None
    )
