"""A run's life, around the roles' loops: its start-up (`start`: run folder, resume step, data positions, threads and
seeds), the claim and lock of its folder (`claim`, `lock`), the env check before anything is written (`preflight`),
the job's printed plan (`plan`), graceful stops on signals (`preempt`), the liveness watch between nodes
(`liveness`), garbage collection during start-up (`startup_gc`), relaunch after a crash (`supervise`), and the
summary at its end (`summary`)."""
