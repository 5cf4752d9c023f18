"""Chat formats of model families: parse a turn into content, reasoning and tool calls (whole or streamed), render
messages through the model's own chat template, and build multi-turn token ids incrementally (docs/chat-formats.md).

Nothing here imports torch: a codec needs only a Hugging Face tokenizer.
"""
