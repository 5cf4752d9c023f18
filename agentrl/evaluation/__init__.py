"""Held-out evaluation: in a training run between steps (`eval:` config), and `agentrl eval` on a checkpoint.

metrics.py   pass@k and the aggregate of per-task results (pure)
runner.py    the rollout side: the split's tasks, this rank's share, episodes with eval's own seeds
report.py    the leader side: gather every rollout rank's results, log `eval/` scalars, write the JSON report
(`agentrl eval CONFIG [--checkpoint PATH]` is agentrl/commands/eval.py)
"""
