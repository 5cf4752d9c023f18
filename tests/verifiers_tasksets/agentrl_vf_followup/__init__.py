"""A two-turn verifiers (v1) environment built from verifiers' own classes: a scripted user asks a sum, then asks
to double it (the Env's `interaction`, as verifiers' alphabet_sort does); rewarded on both answers."""

import verifiers.v1 as vf


class FollowupData(vf.TaskData):
    info: dict


class FollowupTask(vf.Task[FollowupData]):
    @vf.reward
    async def both_answers(self, trace: vf.Trace) -> float:
        replies = [(message.content or "").strip() for message in trace.assistant_messages]
        expected = [str(self.data.info["sum"]), str(2 * self.data.info["sum"])]
        return sum(reply == want for reply, want in zip(replies, expected, strict=False)) / 2


class FollowupEnv(vf.SingleAgentEnv):
    async def run(self, task, agents):
        async with agents.agent.interaction(task) as interaction:
            for prompt in task.data.info["turns"]:
                if (await interaction.turn(prompt)).terminated:
                    break


class FollowupTaskset(vf.Taskset[FollowupTask, vf.TasksetConfig]):
    def load(self) -> list[FollowupTask]:
        tasks = []
        for i in range(12):
            a, b = i % 5, i // 5 + 1
            turns = [f"What is {a} + {b}?", "Now double it."]
            tasks.append(
                FollowupTask(FollowupData(idx=i, prompt=None, info={"turns": turns, "sum": a + b}), self.config.task)
            )
        return tasks


__all__ = ["FollowupEnv", "FollowupTaskset"]
