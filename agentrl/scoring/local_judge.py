"""An LLM judge run frozen by agentrl's torch engine in the job (reward.judge.path): rubric prompts in, rewards out.

api=chat renders each rubric through the judge's chat template (after `system_prompt`, if set) exactly as `agentrl
serve` would for a /chat/completions request; api=completions gives the rubric to the model as written. A batch of
prompts is generated together (the engine batches what is pending), and each reply is read as reward.judge reads an
endpoint's (agentrl/scoring/parse.py). A batch past `timeout_s`, or a reply without a readable score, fails its
episodes with the reason (ScoreFailed).
"""

from __future__ import annotations

import asyncio

from agentrl.config.schema import JudgeConfig, TorchEngineConfig
from agentrl.errors import UserError
from agentrl.scoring.parse import reply_reward
from agentrl.scoring.score import ScoreFailed

JUDGE_SEED = 0  # sampling stream of a judge with temperature > 0: the same on every scorer rank


class LocalJudge:
    """`await judge.score_batch(prompts)`: a reward or a ScoreFailed per rubric prompt. `forwards` counts the
    engine's batches (generation passes) and `prompts` the prompts generated."""

    def __init__(self, config: JudgeConfig, device: str = "cpu"):
        from agentrl.engine import build_torch_engine
        from agentrl.engine.base import SamplingParams
        from agentrl.models.loading import load_causal_lm, load_tokenizer

        self.config = config
        # One batch in the engine at a time (its max_batch_size is batch_size): a batch's timeout_s starts when its
        # generation does, not while it waits behind the batches before it.
        self.generating = asyncio.Semaphore(1)
        self.tokenizer = load_tokenizer(config.path)
        self.renderer = self._renderer() if config.api == "chat" else None
        engine_config = TorchEngineConfig(max_batch_size=config.batch_size)
        model = load_causal_lm(config.path, config.dtype, device)
        self.engine = build_torch_engine(
            model, engine_config, pad_token_id=self.tokenizer.pad_token_id, seed=JUDGE_SEED
        )
        stops = self.renderer.stop_ids if self.renderer is not None else (self.tokenizer.eos_token_id,)
        self.sampling = SamplingParams(
            max_new_tokens=config.max_tokens,
            temperature=config.temperature,
            stop_token_ids=tuple(token for token in stops if token is not None),
        )

    def _renderer(self):
        from agentrl.chat import ChatTemplateError
        from agentrl.serve.render import ChatRenderer

        try:
            return ChatRenderer(self.tokenizer)
        except ChatTemplateError as error:
            raise UserError(
                f"reward.judge.path={self.config.path} cannot render the rubric as a chat ({error}); set "
                "reward.judge.api=completions to give it the rubric as written"
            ) from None

    @property
    def forwards(self) -> int:
        return self.engine.stats["batches"]

    def prompt_ids(self, prompt: str) -> list[int]:
        """The token ids the judge reads for a rubric prompt."""
        if self.renderer is None:
            return self.tokenizer(prompt, add_special_tokens=False)["input_ids"]
        messages = [{"role": "user", "content": prompt}]
        if self.config.system_prompt:
            messages.insert(0, {"role": "system", "content": self.config.system_prompt})
        text, spans = self.renderer.rendered(messages, None)
        return self.renderer.content.ids(text, spans)

    async def score_batch(self, prompts: list[str]) -> list[float | ScoreFailed]:
        try:
            async with self.generating:
                replies = [self._reply(prompt) for prompt in prompts]
                outputs = await asyncio.wait_for(
                    asyncio.gather(*replies, return_exceptions=True), self.config.timeout_s
                )
        except TimeoutError:
            failure = ScoreFailed(
                f"the judge did not score a batch of {len(prompts)} prompts within reward.judge.timeout_s="
                f"{self.config.timeout_s:g} s; raise it, or lower reward.judge.batch_size or max_tokens"
            )
            return [failure] * len(prompts)
        return [self._reward(output) for output in outputs]

    async def _reply(self, prompt: str) -> str:
        output = await self.engine.generate(self.prompt_ids(prompt), self.sampling)
        if output.finish_reason == "abort":
            raise ScoreFailed("the judge's generation was aborted")
        return self.tokenizer.decode(output.output_ids.tolist(), skip_special_tokens=True)

    def _reward(self, reply: str | BaseException) -> float | ScoreFailed:
        return reply_reward(reply, self.config, "the judge's generation raised")

    def shutdown(self) -> None:
        self.engine.shutdown()
