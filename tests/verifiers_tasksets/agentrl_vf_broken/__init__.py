"""A verifiers (v1) taskset whose rubric raises: its episodes must fail with the reason, counted, never score 0."""

import verifiers.v1 as vf


class BrokenTask(vf.Task[vf.TaskData]):
    @vf.stop
    async def one_turn(self, trace: vf.Trace) -> bool:
        return trace.num_turns >= 1

    @vf.reward
    async def broken(self, trace: vf.Trace) -> float:
        raise RuntimeError("this rubric is broken on purpose")


class BrokenTaskset(vf.Taskset[BrokenTask, vf.TasksetConfig]):
    def load(self) -> list[BrokenTask]:
        return [BrokenTask(vf.TaskData(idx=i, prompt=f"Say {i}."), self.config.task) for i in range(4)]


__all__ = ["BrokenTaskset"]
