import pytest

from tests.mpi.helpers import TRANSPORT_COMPARISON, assert_ok, scalars, small_run, train


@pytest.fixture(scope="session", autouse=True)
def _ranks_forked_from_a_preloaded_parent(forkserver):
    """The jobs of `helpers.rank_command()` fork their ranks from the preloaded parent (tests/conftest.py)."""


@pytest.fixture(scope="session")
def mpi_sync_reference(tmp_path_factory, tiny_model_dir) -> dict:
    """TensorBoard scalars of TRANSPORT_COMPARISON with weights.transport=mpi, run once for every comparison."""
    run = tmp_path_factory.mktemp("mpi_reference")
    assert_ok(train(3, small_run(run, tiny_model_dir, **TRANSPORT_COMPARISON, **{"weights.transport": "mpi"})))
    return scalars(run / "run")
