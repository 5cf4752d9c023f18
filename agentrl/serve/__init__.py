"""`agentrl serve`: an OpenAI-compatible HTTP server over agentrl's engines.

- `protocol`: the request and response models and the OpenAI error shape;
- `render`: messages and tools -> the exact prompt token ids, through the model's chat format family (agentrl/chat);
- `reply`: generated ids -> the assistant message (content, reasoning_content, tool_calls), whole or streamed;
- `generation`: one engine on this process, with stop strings and streamed tokens (`LocalBackend`);
- `completions`: one call (render, generate, respond) and the record of its tokens for an `on_call` hook;
- `app`: the FastAPI routes (`openai_router`, `build_app`); `ranks`: requests spread over MPI ranks;
- the `agentrl serve` command itself: agentrl/commands/serve.py.

Nothing here knows about sessions or imports the agent loop: the training gateway mounts `openai_router`
under its own prefix and passes an `on_call` hook per request.
"""
