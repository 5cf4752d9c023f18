"""Question answering from dataset rows, with no code: the row's `prompt` is the first message and its
`answer` is graded by a reward function named in the config.

    data: {train: launch/data/arith_train.jsonl}
    env:
      id: qa
      kwargs:
        reward_fn: number_match      # exact_match (default), number_match, token_f1, contains, math_verify, module:fn
        reward_fns: {gsm8k: number_match}        # by the row's `data_source` column; others use reward_fn
        tools: [calculator]                      # calculator, python, search (envs/qa/tools.py)

A row: {"id": ..., "prompt": "What is 2 + 3?" or [chat messages ending with the user's], "answer": "5",
"data_source": ...}. A turn without a tool call is the final answer; it ends the episode.
"""

from __future__ import annotations

from agentrl.env.tools import ToolEnv
from envs.qa.grading import reward_by_name
from envs.qa.tools import make_tool

ROLES = ("system", "user", "assistant")


class QAEnv(ToolEnv):
    """Answer a dataset row's prompt; graded against its answer.

    Args:
        reward_fn: how answers are graded: exact_match, number_match, token_f1, contains, math_verify or module:function
        reward_fns: {data_source: reward function} for rows whose `data_source` column names one
        tools: tools the model may call: calculator, python, search
        tool_options: {tool name: {option: value}} (envs/qa/tools.py lists them)
        max_steps: turns before the episode is truncated
    """

    required_columns = ("prompt", "answer")
    reusable = True  # reset sets the row, the question and the history; ToolEnv's the turn count

    def __init__(
        self,
        reward_fn: str = "exact_match",
        reward_fns: dict[str, str] | None = None,
        tools: list[str] | tuple[str, ...] = (),
        tool_options: dict[str, dict] | None = None,
        max_steps: int = 6,
    ):
        super().__init__(max_steps=max_steps)
        self.reward = reward_by_name(reward_fn)
        self.rewards = {
            source: reward_by_name(name, f"env.kwargs.reward_fns.{source}")
            for source, name in (reward_fns or {}).items()
        }
        tool_options = tool_options or {}
        unused = sorted(set(tool_options) - set(tools))
        if unused:
            raise ValueError(f"qa env: tool_options for {unused}, which env.kwargs.tools does not list")
        for name in tools:
            self.add_tool(make_tool(name, tool_options.get(name) or {}))
        self.row: dict | None = None
        self.question = ""
        self.history: list[tuple[str, str]] = []

    def check_row(self, row: dict) -> str | None:
        """None when the env can serve `row`, else what is wrong with it."""
        prompt = row.get("prompt")
        if prompt is None:
            return "its prompt is missing (column 'prompt')"
        if isinstance(prompt, str):
            if not prompt.strip():
                return "its prompt is empty"
        elif isinstance(prompt, list):
            if problem := _check_messages(prompt):
                return f"its prompt {problem}"
        else:
            return f"its prompt must be a string or a list of chat messages, not {type(prompt).__name__}"
        if row.get("answer") is None:
            return "its answer is missing (column 'answer')"
        return None

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed, options=options)
        if options is None:
            raise ValueError(
                "the qa env serves dataset rows: set data.train to a .jsonl/.parquet file with 'prompt' and "
                "'answer' columns (each row reaches reset as options; `agentrl check-env qa --data FILE`)"
            )
        if problem := self.check_row(options):
            raise ValueError(f"the qa env cannot serve this row: {problem}")
        self.row, self.history = options, []
        prompt = options["prompt"]
        context = []
        if isinstance(prompt, str):
            self.question = prompt
        else:
            context = [{"role": m["role"], "content": m["content"]} for m in prompt[:-1]]
            self.question = prompt[-1]["content"]
        info = {"answer": options["answer"]}
        if options.get("data_source") is not None:
            info["data_source"] = options["data_source"]
        if context:
            info["prompt_messages"] = context
        return self.question, info

    def step(self, action: str):
        observation, reward, terminated, truncated, info = super().step(action)
        self.history.append((action, observation))
        return observation, reward, terminated, truncated, info

    def answer(self, text: str):
        grade = self.rewards.get(self.row.get("data_source"), self.reward)
        answer = self.row["answer"]
        score = grade(
            completion=text,
            task=self.question,
            answer=answer if isinstance(answer, str | list) else str(answer),
            transcript=[*self.history, (text, "")],
            env_reward=0.0,
            info={},
            reset_info=self.row,
            finish="terminated",
        )
        success = score.success if score.success is not None else score.reward > 0
        return ("correct" if success else "wrong"), score.reward, True, False, {"success": success}


def _check_messages(messages: list) -> str | None:
    if not messages:
        return "is an empty list of messages"
    for position, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("content"), str):
            return f"message {position} is not a {{'role': ..., 'content': str}} mapping"
        if message.get("role") not in ROLES:
            return f"message {position} has role {message.get('role')!r}; prompts use {', '.join(ROLES)}"
        if message["role"] == "system" and position:
            return f"message {position} is a system message after the first"
    if messages[-1]["role"] != "user":
        return f"must end with a user message (the question), not {messages[-1]['role']!r}"
    return None
