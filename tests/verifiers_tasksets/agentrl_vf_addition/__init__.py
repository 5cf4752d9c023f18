"""A verifiers (v1) taskset built from verifiers' own classes: one-turn additions, rewarded by exact match."""

import verifiers.v1 as vf


class AdditionData(vf.TaskData):
    answer: int


class AdditionTask(vf.Task[AdditionData]):
    @vf.stop
    async def one_turn(self, trace: vf.Trace) -> bool:
        return trace.num_turns >= 1

    @vf.reward
    async def exact(self, trace: vf.Trace) -> float:
        return float((trace.last_reply or "").strip() == str(self.data.answer))


class AdditionConfig(vf.TasksetConfig):
    num_tasks: int = 16


class AdditionTaskset(vf.Taskset[AdditionTask, AdditionConfig]):
    def load(self) -> list[AdditionTask]:
        return [
            AdditionTask(AdditionData(idx=i, prompt=f"What is {i} + {i}?", answer=2 * i), self.config.task)
            for i in range(self.config.num_tasks)
        ]


__all__ = ["AdditionTaskset"]
