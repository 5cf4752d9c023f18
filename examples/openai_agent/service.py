"""The calculator agent as a long-lived service: it claims sessions from every gateway of a training run and
runs `agent.solve` in each, many at a time. Only the `openai` SDK and httpx (which it ships with); no agentrl.

    python examples/openai_agent/service.py RUN_DIR [--concurrency 32]

Each rollout rank announces its gateway in RUN_DIR/gateway/rollout-N.json (its URL and service key). The
service claims a session (POST /sessions/claim), solves the task through the session's own base URL and key,
and ends it with the reward (POST /sessions/{id}/end). It stops when the run's gateways are gone.
"""

import argparse
import asyncio
import json
from pathlib import Path

import httpx
from agent import score, solve
from openai import AsyncOpenAI


async def worker(gateway: dict, http: httpx.AsyncClient, counts: dict) -> None:
    headers = {"Authorization": f"Bearer {gateway['service_key']}"}
    while True:
        try:
            claim = await http.post(f"{gateway['url']}/sessions/claim", headers=headers, timeout=120)
        except httpx.TimeoutException:
            continue  # the rank is training, not generating: no session yet
        except httpx.HTTPError:
            if not gateway["file"].exists():
                return  # the gateway closed: its run ended
            await asyncio.sleep(1.0)
            continue
        if claim.status_code == 204:
            continue
        claim.raise_for_status()
        session = claim.json()
        client = AsyncOpenAI(base_url=session["base_url"], api_key=session["api_key"], max_retries=2, http_client=http)
        try:
            answer, _ = await solve(client, session["task"]["question"])
            correct = score(answer, session["task"]["answer"])
        except Exception as error:  # one failed episode; the service goes on
            print(f"service: session {session['session_id']}: {error!r}", flush=True)
            correct = False
        end = session["base_url"].removesuffix("/v1") + "/end"
        auth = {"Authorization": f"Bearer {session['api_key']}"}
        try:
            await http.post(end, json={"reward": 1.0 if correct else 0.0, "success": correct}, headers=auth)
        except httpx.HTTPError as error:
            print(f"service: session {session['session_id']}: the reward did not arrive: {error!r}", flush=True)
        counts["episodes"] += 1


async def serve(run_dir: Path, concurrency: int) -> None:
    """Serve every gateway of the run as it announces itself (ranks start at different times), until all are gone."""
    folder = run_dir / "gateway"
    counts, started, tasks = {"episodes": 0}, set(), []
    async with httpx.AsyncClient(timeout=300, limits=httpx.Limits(max_connections=None)) as http:
        while not started or any(not task.done() for task in tasks):
            for path in sorted(folder.glob("rollout-*.json")):
                if path in started:
                    continue
                try:
                    gateway = {**json.loads(path.read_text()), "file": path}
                except (json.JSONDecodeError, FileNotFoundError):
                    continue  # still being written, or gone: the next look reads it
                started.add(path)
                tasks += [asyncio.create_task(worker(gateway, http, counts)) for _ in range(concurrency)]
                print(f"service: gateway {path.name}, {concurrency} sessions at a time", flush=True)
            await asyncio.sleep(0.5)
        await asyncio.gather(*tasks)
    print(f"service: {counts['episodes']} episodes", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--concurrency", type=int, default=32)
    args = parser.parse_args()
    asyncio.run(serve(args.run_dir, args.concurrency))
