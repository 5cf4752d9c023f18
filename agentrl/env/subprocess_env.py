"""Run an environment in its own Python process, so a crash or hang takes down only that process.

    env:
      id: agentrl.env.subprocess_env:SubprocessEnv
      kwargs: {env_id: calculator, kwargs: {max_value: 50}}

`SubprocessEnv` starts `python -m agentrl.env.subprocess_env` (one process per episode) and
forwards reset/step/close to the env built there. If the process dies (a segfault,
`os._exit`, the OOM killer), the call raises here and the host ends that episode with
`finish=error`; on a timeout the host calls `kill()`. The child gets no MPI variables,
so it never joins the MPI job, and its stdout is moved to stderr so that prints in env
code cannot corrupt the request pipe. This isolates faults; it is not a security
boundary (the child has the parent's user, files and network).
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import traceback

from agentrl.env.api import TextEnv
from agentrl.transport import MPI_VARIABLE_PREFIXES


class EnvProcessDied(RuntimeError):
    pass


class SubprocessEnv(TextEnv):
    def __init__(self, env_id: str, kwargs: dict | None = None):
        super().__init__()
        self.env_id = env_id
        child_env = {k: v for k, v in os.environ.items() if not k.startswith(MPI_VARIABLE_PREFIXES)}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "agentrl.env.subprocess_env"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=child_env,
        )
        self.tools = self._call("make", env_id, kwargs or {})

    def reset(self, *, seed=None, options=None):
        return self._call("reset", seed, options)

    def step(self, action):
        return self._call("step", action)

    def close(self):
        if self.process.poll() is None:
            try:
                self._call("close")
            finally:
                self.kill()

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()

    def _call(self, *request):
        try:
            pickle.dump(request, self.process.stdin)
            self.process.stdin.flush()
            ok, value = pickle.load(self.process.stdout)
        except (EOFError, BrokenPipeError, pickle.UnpicklingError):
            self.kill()
            raise EnvProcessDied(
                f"the process running env {self.env_id!r} exited with code {self.process.returncode} "
                f"during {request[0]}(); its stderr (above in the log) says why"
            ) from None
        if not ok:
            raise RuntimeError(f"in the env process:\n{value}")
        return value


def child_loop(channel_in, channel_out) -> None:
    """The child's loop: build the env, then answer requests until close or end of input."""
    from agentrl.env.registry import make

    env = None
    while True:
        try:
            op, *args = pickle.load(channel_in)
        except EOFError:
            return
        try:
            if op == "make":
                env_id, kwargs = args
                env = make(env_id, **kwargs)
                value = list(getattr(env, "tools", None) or [])
            elif op == "reset":
                seed, options = args
                value = env.reset(seed=seed, options=options)
            elif op == "step":
                value = env.step(*args)
            elif op == "close":
                value = env.close()
            else:
                raise ValueError(f"unknown op {op!r}")
            reply = (True, value)
        except Exception:  # env code is user code: send the traceback to the parent
            reply = (False, traceback.format_exc(limit=-5))
        pickle.dump(reply, channel_out)
        channel_out.flush()
        if op == "close":
            return


if __name__ == "__main__":
    requests = os.fdopen(os.dup(0), "rb")
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # prints in env code go to stderr, not into the reply pipe
    sys.stdout = sys.stderr
    child_loop(requests, replies)
