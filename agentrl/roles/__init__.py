"""One file per role, each read top to bottom: setup, loop, shutdown.

- `trainer.run_trainer`: take batches, train, publish weights, log, checkpoint;
- `rollout.run_rollout`: generate episodes and ship them, in lockstep or running ahead;
- `env.run_env`: host envs for rollout ranks;
- `single.run_single_process`: all of it in turns, in one process (world size 1).
"""
