"""The model's files and how they load: a causal LM and its tokenizer (`loading`), LoRA adapter folders
(`adapters`), hub ids (`hub`), the chat template and tools in the prompt (`chat_format`), message content as
text (`content_tokens`), the tiny quickstart model (`tiny`) and the value model (`value`)."""
