"""A run's life, around the roles' loops: its start-up (run folder, resume step, data positions, threads and seeds),
the claim and lock of its folder, graceful stops on signals, the liveness watch between nodes, garbage collection
during start-up, relaunch after a crash, and the summary at its end."""
