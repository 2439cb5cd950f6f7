"""``looprl serve``: the agent behind the session/feedback API (``serve/api.py``), one or two arms.

    looprl serve --model policies --store feedback.db --port 8400 --token s3cret
    looprl serve --model policies --model-b policies/v0003 --split-b 0.1 --experiment v2-vs-v3 ...

``--model`` is a model directory or a policies directory written by ``looprl feedback cycle``
(its ``current.json`` names the promoted version; ``POST /v1/reload`` swaps a newer promotion
into the running engine). Sessions are labelled with each policy's
version, which is what the cycle and the A/B report select on.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(help="Serve the agent to users and record feedback on its edits.",
                  invoke_without_command=True)


@app.callback()
def serve(
    model: Annotated[Path, typer.Option(help="model dir, or policies dir with current.json (arm A)")],
    store: Annotated[Path, typer.Option(help="SQLite feedback store (created if missing)")],
    model_b: Annotated[Path | None, typer.Option("--model-b", help="candidate for arm B")] = None,
    port: Annotated[int, typer.Option(help="TCP port")] = 8400,
    host: Annotated[str, typer.Option(help="bind address")] = "127.0.0.1",
    token: Annotated[str | None, typer.Option(
        help="bearer token (default: LOOPRL_SERVE_TOKEN or a random one, printed)")] = None,
    experiment: Annotated[str, typer.Option(help="A/B experiment name (part of the arm hash)")] = "default",
    split_b: Annotated[float, typer.Option(help="share of users on arm B")] = 0.5,
    allowed_root: Annotated[list[str], typer.Option(help="repos must lie under this (repeatable)")] = [],  # noqa: B006
    venv: Annotated[str | None, typer.Option(help="Python env visible in sandboxes")] = None,
    max_turns: Annotated[int, typer.Option(help="agent turns per session")] = 30,
    max_new_tokens: Annotated[int, typer.Option(help="tokens per turn")] = 1024,
    context_window: Annotated[int, typer.Option(help="tokens per segment")] = 8192,
    max_concurrent: Annotated[int, typer.Option(help="sessions at once")] = 2,
    min_sessions: Annotated[int, typer.Option(help="scored sessions per arm before an A/B decision")] = 100,
) -> None:
    """Serve POLICY (and a candidate) through /v1/sessions, /v1/sessions/{id}/feedback, /v1/ab."""
    import base64

    import uvicorn

    from looprl.feedback.cycle import read_policy
    from looprl.feedback.store import FeedbackStore
    from looprl.harness.agent import AgentConfig
    from looprl.inference import TorchEngine
    from looprl.serve.api import ServeConfig, make_app

    tok = token or os.environ.get("LOOPRL_SERVE_TOKEN") or base64.urlsafe_b64encode(os.urandom(18)).decode()
    refs = {"A": read_policy(model)}
    if model_b is not None:
        refs["B"] = read_policy(model_b)
    engines = {arm: TorchEngine.from_path(ref.path) for arm, ref in refs.items()}
    cfg = ServeConfig(token=tok, experiment=experiment, split_b=split_b,
                      agent=AgentConfig(max_turns=max_turns, max_new_tokens=max_new_tokens,
                                        context_window=context_window),
                      venv=venv, allowed_roots=tuple(allowed_root), max_concurrent=max_concurrent,
                      min_sessions=min_sessions)
    app_ = make_app(engines, engines["A"].tokenizer, FeedbackStore(store), cfg,
                    policy_versions={arm: ref.version for arm, ref in refs.items()},
                    policy_sources={"A": str(model), **({"B": str(model_b)} if model_b else {})})
    arms = ", ".join(f"{a}=v{r.version} ({r.path})" for a, r in refs.items())
    typer.echo(f"looprl agent server on http://{host}:{port} — arms {arms} — token {tok}")
    try:
        uvicorn.run(app_, host=host, port=port, log_level="warning")
    finally:
        for e in engines.values():
            e.close()
