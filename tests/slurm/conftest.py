import os
import tempfile
from pathlib import Path

import pytest

from tests.slurm.cluster import Cluster, install_packages


@pytest.fixture(scope="session")
def slurm_cluster():
    """A single-node SLURM of our own (installed with apt when missing); its daemons are stopped afterwards."""
    why_not = install_packages()
    if why_not:
        pytest.skip(why_not)
    cluster = Cluster(Path(tempfile.mkdtemp(prefix="agentrl-slurm-")), cpus=max(os.cpu_count() or 1, 4))
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
