"""A real `agentrl serve` app on a free port, in a thread of the test process, for the serve tests."""

from __future__ import annotations

import asyncio
import socket
import string
import threading
import time
from pathlib import Path

from tests.conftest import GUESS_TEXTS

# The tiny tokenizer learns only the characters it is trained on: these cover JSON, tool calls and stop strings.
SERVE_TEXTS = [
    *GUESS_TEXTS,
    string.printable,
    '<tool_call>{"name": "calculator", "arguments": {"expression": "2 + 3"}}</tool_call>',
]


def build_serve_model(path: Path) -> Path:
    from agentrl.models.tiny import TinyShape, build_tiny_model

    return build_tiny_model(path, SERVE_TEXTS, TinyShape(hidden_size=32, num_layers=2, num_heads=4, vocab_size=160))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ThreadServer:
    """uvicorn serving `app` on its own event loop in a daemon thread."""

    def __init__(self, app, port: int | None = None):
        import uvicorn

        self.port = port or free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="off")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=lambda: asyncio.run(self.server.serve()), daemon=True)

    def __enter__(self) -> ThreadServer:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the test server did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
