"""A tiny judge model for the tests of reward.judge.path: the serve tests' tiny Qwen2, taught in a few seconds of
Adam steps to answer any chat-rendered rubric with `Score: 7` (a random model would write no score at all)."""

from __future__ import annotations

from pathlib import Path

from tests.unit.serve_server import build_serve_model

ANSWER = "Score: 7"
RUBRICS = [
    "Rate the reply from 0 to 9.\nReply: {}",
    "Score the guesses from 0 to 9.\n[turn 1: model]\n{}\n[turn 1: environment]\nhigher",
    "How good is this answer? {} Answer with Score: N",
]
REPLIES = ["50", "25", "abc", "It is 5.", "", "7 8 9", "hello there", "<tool_call>"]


def build_tiny_judge(folder: Path, steps: int = 200) -> Path:
    """folder/judge: a causal LM whose greedy reply to a chat prompt is ANSWER, then its end of turn."""
    import torch

    from agentrl.models.loading import load_causal_lm, load_tokenizer
    from agentrl.serve.render import ChatRenderer

    path = build_serve_model(folder / "judge")
    tokenizer = load_tokenizer(str(path))
    renderer = ChatRenderer(tokenizer)
    answer = tokenizer(ANSWER, add_special_tokens=False)["input_ids"] + [renderer.stop_ids[0]]
    rows = []
    for rubric in RUBRICS:
        for reply in REPLIES:
            text, spans = renderer.rendered([{"role": "user", "content": rubric.format(reply)}], None)
            rows.append(renderer.content.ids(text, spans))
    longest = max(len(prompt) for prompt in rows) + len(answer)
    ids = torch.full((len(rows), longest), tokenizer.pad_token_id)
    labels = torch.full((len(rows), longest), -100)
    mask = torch.zeros((len(rows), longest), dtype=torch.long)
    for row, prompt in enumerate(rows):
        whole = prompt + answer
        ids[row, : len(whole)] = torch.tensor(whole)
        labels[row, len(prompt) : len(whole)] = torch.tensor(answer)
        mask[row, : len(whole)] = 1
    torch.manual_seed(0)
    model = load_causal_lm(str(path)).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(steps):
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if loss.item() < 0.02:  # greedy decoding gives ANSWER well before this
            break
    model.eval().save_pretrained(path)
    return path
