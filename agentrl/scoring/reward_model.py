"""A sequence-classification reward model on this rank: texts in, one logit each out, a batch per forward.

Forwards run one at a time in a thread of their own, so the rank's event loop (its episodes, its engine) goes on
meanwhile. A text longer than `max_length` tokens fails (it is never cut: a cut transcript loses its ending, the
part being judged).
"""

from __future__ import annotations

import asyncio
import math
from concurrent.futures import ThreadPoolExecutor

from agentrl.config.schema import RewardModelConfig
from agentrl.errors import UserError
from agentrl.scoring.score import ScoreFailed


class RewardModel:
    """`await model.score_batch(texts)`: a reward or a ScoreFailed per text."""

    def __init__(self, config: RewardModelConfig, device: str = "cpu"):
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        self.config, self.device = config, device
        self.tokenizer = AutoTokenizer.from_pretrained(config.path)
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        dtype = torch.bfloat16 if config.dtype == "bfloat16" else torch.float32
        self.model = AutoModelForSequenceClassification.from_pretrained(config.path, dtype=dtype).to(device).eval()
        self.model.config.pad_token_id = self.tokenizer.pad_token_id  # batched rows read their last real token
        labels = self.model.config.num_labels
        if config.label >= labels:
            raise UserError(
                f"reward.model.label={config.label}, but {config.path} has {labels} label(s); set reward.model.label "
                f"below {labels} (0 for a one-label reward model)"
            )
        self.forwards = ThreadPoolExecutor(max_workers=1, thread_name_prefix="reward-model")

    def uses_chat_template(self) -> bool:
        return self.config.prompt is None

    def check_chat_template(self) -> None:
        if self.uses_chat_template() and not getattr(self.tokenizer, "chat_template", None):
            raise UserError(
                f"reward.model.path={self.config.path} has no chat template to write the conversation with; set "
                "reward.model.prompt to the text it scores, e.g. '{task}\\n\\n{completion}'"
            )

    async def score_batch(self, texts: list[str]) -> list[float | ScoreFailed]:
        loop = asyncio.get_running_loop()
        try:
            return await asyncio.wait_for(
                loop.run_in_executor(self.forwards, self._forward, texts), self.config.timeout_s
            )
        except TimeoutError:
            failure = ScoreFailed(
                f"the reward model's forward of {len(texts)} texts took over reward.model.timeout_s="
                f"{self.config.timeout_s:g} s; raise it, or lower reward.model.batch_size or max_length"
            )
            return [failure] * len(texts)

    def _forward(self, texts: list[str]) -> list[float | ScoreFailed]:
        import torch

        ids = [self.tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]
        results: list[float | ScoreFailed] = [
            ScoreFailed(
                f"an episode's text is {len(row)} tokens, over reward.model.max_length={self.config.max_length}; "
                "raise max_length (the model's context allowing), or shorten episodes (rollout.max_episode_tokens)"
            )
            for row in ids
        ]
        fitting = [index for index, row in enumerate(ids) if len(row) <= self.config.max_length]
        if not fitting:
            return results
        batch = self.tokenizer.pad(
            {"input_ids": [ids[index] for index in fitting]}, padding=True, return_tensors="pt"
        ).to(self.device)
        with torch.inference_mode():
            logits = self.model(**batch).logits[:, self.config.label].float().tolist()
        for index, logit in zip(fitting, logits, strict=True):
            value = _sigmoid(logit) if self.config.transform == "sigmoid" else logit
            results[index] = value if math.isfinite(value) else ScoreFailed(f"the reward model gave {value}")
        return results

    def text(self, conversation: list[dict]) -> str:
        """The conversation through the model's chat template, as the text to score."""
        return self.tokenizer.apply_chat_template(conversation, tokenize=False)


def _sigmoid(x: float) -> float:
    if x >= 0:
        return 1 / (1 + math.exp(-x))
    return math.exp(x) / (1 + math.exp(x))  # no overflow for a very negative logit
