"""agentrl: MPI-native multi-turn agentic RL for language models."""

import os as _os

__version__ = "0.1.0"

if _os.environ.get("AGENTRL_NO_MPI"):  # set for SGLang's spawned children: importing agentrl there must not join MPI
    import mpi4py as _mpi4py

    _mpi4py.rc.initialize = False
    _mpi4py.rc.finalize = False
