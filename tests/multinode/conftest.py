import shutil

import pytest

from tests.multinode import cluster, jobs


@pytest.fixture(scope="session")
def nodes():
    """Two nodes of the test bed (network, UTS and mount namespaces on a private bridge), removed afterwards."""
    why = cluster.why_unavailable()
    if why:
        pytest.skip(f"no multi-node test bed here: {why}")
    try:
        yield cluster.up(2)
    finally:
        cluster.down()


@pytest.fixture(scope="session")
def shared_model(nodes, tiny_model_dir):
    """The tiny test model where every node sees it (each node's /tmp is its own)."""
    path = jobs.shared_dir("model") / "tiny"
    shutil.copytree(tiny_model_dir, path)
    return path
