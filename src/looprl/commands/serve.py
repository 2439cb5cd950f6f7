"""``looprl serve``: the agent behind the session/feedback API (``serve/api.py``), one or two arms.

    looprl serve --model policies --store feedback.db --port 8400 --token s3cret --allowed-root /srv/repos
    looprl serve --model policies --model-b policies/v0003 --split-b 0.1 --experiment v2-vs-v3 ...
    looprl serve --engine openai --engine-url http://gpu-box:8000/v1 --tokenizer MODEL_DIR ...
    looprl serve --engine vllm --model /models/qwen-coder -E gpu_memory_utilization=0.8 ...

``--model`` is a model directory or a policies directory written by ``looprl feedback cycle``
(its ``current.json`` names the promoted version). Sessions are labelled with each policy's
version, which is what the cycle and the A/B report select on.

A served policies dir is followed by itself (``--watch SECONDS``, default 5; 0: only on
``POST /v1/reload``): a promotion (``current.json``) goes live on arm A without a restart, and with
the torch or vllm engine a second engine (arm B, started on A's weights, no traffic; with vllm a
second worker, its own start-up and KV reservation) serves the dir's ``candidate.json`` (``feedback.policies.offer_candidate``: version, experiment, split_b) to that
share of users until it is withdrawn. ``--policies DIR`` beside a plain model dir ``--model M``
serves M until DIR has a ``current.json``, then follows DIR. ``--model-b`` is a fixed arm B (split
by ``--experiment``/``--split-b``; no candidate pointer). A pointer that cannot be read is logged
in one line and retried at the next tick.

    looprl serve --model M --policies runs/x/policies --store fb.db --watch 5 ...

``--engine`` picks what samples the agent's turns, by name behind the ``Engine`` seam
(``inference.make_engine``): ``torch`` (in this process, the default), ``vllm`` (a worker
process in `make vllm`'s venv), ``openai`` (any OpenAI-compatible server, e.g. ``looprl model serve`` or vLLM's:
``--engine-url`` per arm, token ids in and out through ``/v1/completions``), or a plugin's name.
``-E KEY=VALUE`` passes more keyword arguments to the engine (values read as JSON when they
parse; with ``vllm``, ``VLLMEngine``'s or vLLM's own engine arguments, which vLLM checks at
start-up). A local engine's tokens carry its policy's version; ``vllm`` reserves a context of
``--context-window`` tokens (at most the model's positions; ``-E max_model_len=N`` says
otherwise) and takes promotions in flight, as torch does. A remote engine serves what it
serves: ``--model`` then only names the policy whose version labels the sessions and whose
promotions ``/v1/reload`` pushes to the engine; the harness renders its format with
``--tokenizer`` (default: the ``--model`` directory).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Any

import typer

LOCAL_ENGINES = ("torch", "vllm")
"""The built-in engines that load ``--model`` themselves: each arm's starts on its policy's
version, and an engine B can take a candidate's weights."""

app = typer.Typer(help="Serve the agent to users and record feedback on its edits.",
                  invoke_without_command=True)


@app.callback()
def serve(
    store: Annotated[Path, typer.Option(help="SQLite feedback store (created if missing)")],
    model: Annotated[Path | None, typer.Option(
        help="model dir, or policies dir with current.json (arm A)")] = None,
    model_b: Annotated[Path | None, typer.Option("--model-b", help="candidate for arm B")] = None,
    engine: Annotated[str, typer.Option(
        help="what samples the turns: torch, vllm, openai, or a plugin's engine name")] = "torch",
    engine_url: Annotated[str | None, typer.Option(
        help="--engine openai: the server's base URL for arm A (http://host:port/v1)")] = None,
    engine_url_b: Annotated[str | None, typer.Option(
        "--engine-url-b", help="--engine openai: the server for arm B")] = None,
    engine_model: Annotated[str, typer.Option(
        help="--engine openai: the model name the server serves")] = "looprl",
    engine_api_key: Annotated[str | None, typer.Option(
        envvar="LOOPRL_ENGINE_API_KEY", show_envvar=True,
        help="--engine openai: the server's API key")] = None,
    engine_option: Annotated[list[str], typer.Option(
        "--engine-option", "-E", help="KEY=VALUE keyword argument for the engine (repeatable)")
    ] = [],  # noqa: B006
    tokenizer: Annotated[Path | None, typer.Option(
        help="the served model's tokenizer dir (default: --model's; needed for a remote engine)")
    ] = None,
    port: Annotated[int, typer.Option(help="TCP port", min=0, max=65535)] = 8400,
    host: Annotated[str, typer.Option(help="bind address")] = "127.0.0.1",
    token: Annotated[str | None, typer.Option(
        help="bearer token (default: LOOPRL_SERVE_TOKEN or a random one, printed)")] = None,
    experiment: Annotated[str, typer.Option(help="A/B experiment name (part of the arm hash)")] = "default",
    split_b: Annotated[float, typer.Option(help="share of users on arm B", min=0.0, max=1.0)] = 0.5,
    allowed_root: Annotated[list[str], typer.Option(
        help="repos must lie under this (repeatable; default: looprl's home only)")] = [],  # noqa: B006
    venv: Annotated[str | None, typer.Option(help="Python env visible in sandboxes")] = None,
    max_turns: Annotated[int, typer.Option(help="agent turns per session")] = 30,
    max_new_tokens: Annotated[int, typer.Option(help="tokens per turn")] = 1024,
    context_window: Annotated[int, typer.Option(help="tokens per segment")] = 8192,
    max_concurrent: Annotated[int, typer.Option(help="sessions at once")] = 2,
    min_sessions: Annotated[int, typer.Option(help="scored sessions per arm before an A/B decision")] = 100,
    drain: Annotated[float, typer.Option(
        help="on SIGTERM: seconds running sessions may finish before they are cancelled")] = 60.0,
    watch: Annotated[float, typer.Option(
        help="re-read the policies dir every SECONDS: promotions and candidates go live by "
             "themselves (0 = only on POST /v1/reload)", min=0.0)] = 5.0,
    policies: Annotated[Path | None, typer.Option(
        help="policies dir to follow (default: --model when it is one): arm A serves its "
             "current.json once it exists, arm B its candidate.json", file_okay=False)] = None,
) -> None:
    """Serve POLICY (and a candidate) through /v1/sessions, /v1/sessions/{id}/feedback, /v1/ab."""
    import base64

    from looprl.feedback.policies import POINTER, read_policy
    from looprl.feedback.store import FeedbackStore
    from looprl.harness.agent import AgentConfig
    from looprl.serve.api import ServeConfig

    for r in allowed_root:
        if not Path(r).is_dir():
            raise typer.BadParameter(f"--allowed-root {r} is not a directory")
    if not drain > 0:
        raise typer.BadParameter("--drain must be > 0 seconds")
    tok = token or os.environ.get("LOOPRL_SERVE_TOKEN") or base64.urlsafe_b64encode(os.urandom(18)).decode()
    model, policies = _followed(model, policies)
    # arm A starts on the policies dir's current policy when there is one, else on --model
    source_a = policies if policies is not None and (policies / POINTER).is_file() else model
    refs = {arm: read_policy(m) for arm, m in (("A", source_a), ("B", model_b)) if m is not None}
    # a local engine B (torch, vllm) follows the dir's candidate.json (--model-b: a fixed arm B)
    candidate_b = engine in LOCAL_ENGINES and policies is not None and model_b is None
    tokenizer_dir = tokenizer or (refs["A"].path if "A" in refs else None)
    if engine == "openai":
        specs, chat_tok = _remote_specs(refs, _engine_options(engine_option), tokenizer_dir,
                                        {"A": engine_url, "B": engine_url_b},
                                        model=engine_model, api_key=engine_api_key)
    else:
        specs, chat_tok = _local_specs(engine, refs, _engine_options(engine_option),
                                       tokenizer_dir, candidate_b, context_window)
    cfg = ServeConfig(token=tok, experiment=experiment, split_b=split_b,
                      agent=AgentConfig(max_turns=max_turns, max_new_tokens=max_new_tokens,
                                        context_window=context_window),
                      venv=venv, allowed_roots=tuple(allowed_root), max_concurrent=max_concurrent,
                      min_sessions=min_sessions, drain_s=drain, watch_s=watch)
    _run_server(engine, specs, chat_tok, refs, cfg, FeedbackStore(store), host, port,
                sources={"A": model, "B": model_b}, policies=policies, candidate_b=candidate_b)


def _run_server(engine: str, specs: dict[str, dict[str, Any]], chat_tok: Any,
                refs: dict[str, Any], cfg: Any, store: Any, host: str, port: int, *,
                sources: dict[str, Path | None], policies: Path | None, candidate_b: bool) -> None:
    """Start the arms' engines, serve the app until SIGTERM, then stop the engines."""
    from looprl.asgi import run
    from looprl.serve.api import make_app

    engines = _make_engines(engine, specs)
    versions = {arm: ref.version for arm, ref in refs.items()}
    if candidate_b:
        versions["B"] = versions["A"]
    try:
        app_ = make_app(engines, chat_tok, store, cfg, policy_versions=versions,
                        policy_sources={arm: str(m) for arm, m in sources.items() if m is not None},
                        policies=None if policies is None else str(policies),
                        candidate_b=candidate_b)
        arms = ", ".join(f"{a}=v{refs[a].version} ({refs[a].path})" if a in refs
                         else f"{a}={specs[a]['base_url']}" for a in engines
                         if not (candidate_b and a == "B"))
        follows = (f" — following {policies} every {cfg.watch_s:g} s"
                   + (" (arm B: its candidate.json)" if candidate_b else "")) if policies else ""
        typer.echo(f"looprl agent server on http://{host}:{port} — {engine} engine, arms {arms}"
                   f"{follows} — token {cfg.token}")
        run(app_, host=host, port=port, drain=app_.state.drain, drain_s=cfg.drain_s)
    finally:  # on SIGTERM/SIGINT too (``asgi.run`` returns): no engine worker outlives the server
        for e in engines.values():
            _close(e)


def _followed(model: Path | None, policies: Path | None) -> tuple[Path | None, Path | None]:
    """(--model, the policies dir to follow): a --model that is a policies dir is followed, and
    a --policies dir alone is also the model until it names one."""
    from looprl.feedback.policies import POINTER

    if model is not None and (model / POINTER).is_file():  # --model is a policies dir: follow it
        if policies is not None and policies.resolve() != model.resolve():
            raise typer.BadParameter(f"--model {model} is a policies dir already; drop "
                                     f"--policies {policies} or pass a model dir as --model",
                                     param_hint="--policies")
        policies = model
    if policies is not None and model is None:
        if not (policies / POINTER).is_file():
            raise typer.BadParameter(f"--policies {policies} has no {POINTER} yet: pass --model "
                                     "DIR, the model served until it has one", param_hint="--model")
        model = policies
    return model, policies


def _remote_specs(refs: dict[str, Any], options: dict[str, Any], tokenizer_dir: Path | None,
                  urls: dict[str, str | None], *, model: str, api_key: str | None
                  ) -> tuple[dict[str, dict[str, Any]], Any]:
    """Each arm's OpenAI-engine options and the tokenizer the harness renders with."""
    urls = {arm: u for arm, u in urls.items() if u}
    if "A" not in urls or set(refs) - set(urls):
        raise typer.BadParameter("--engine openai needs --engine-url for arm A (and "
                                 "--engine-url-b with --model-b)", param_hint="--engine-url")
    if tokenizer_dir is None:
        raise typer.BadParameter("a remote engine needs the served model's tokenizer to "
                                 "render the harness's format: pass --tokenizer DIR",
                                 param_hint="--tokenizer")
    chat_tok = _tokenizer(tokenizer_dir)
    return {arm: {"base_url": u, "model": model, "api_key": api_key, "tokenizer": chat_tok,
                  **options} for arm, u in urls.items()}, chat_tok


def _local_specs(engine: str, refs: dict[str, Any], options: dict[str, Any],
                 tokenizer_dir: Path | None, candidate_b: bool, context_window: int
                 ) -> tuple[dict[str, dict[str, Any]], Any]:
    """Each arm's in-process engine options, and the tokenizer when the engine has none. A
    built-in engine starts labelled with its policy's version (its tokens carry it); vLLM
    reserves a context of ``--context-window`` tokens (at most the model's positions) unless
    ``-E max_model_len=N`` says otherwise."""
    if "A" not in refs:
        raise typer.BadParameter(f"--engine {engine} runs a model in this process: pass "
                                 "--model DIR", param_hint="--model")
    key = {"torch": "path", "vllm": "model_path"}.get(engine, "path")
    specs = {arm: {key: str(ref.path), **options} for arm, ref in refs.items()}
    if engine in LOCAL_ENGINES:
        for arm, spec in specs.items():
            spec.setdefault("policy_version", refs[arm].version)
            if engine == "vllm":
                spec.setdefault("max_model_len", min(context_window, _max_positions(refs[arm].path)))
    if candidate_b:
        specs["B"] = dict(specs["A"])  # A's weights; no traffic until a candidate is offered
    # a torch engine has the model's own tokenizer; others may not expose one
    return specs, None if engine == "torch" else _tokenizer(tokenizer_dir)  # type: ignore[arg-type]


def _max_positions(model: Path) -> int:
    from transformers import AutoConfig

    return int(getattr(AutoConfig.from_pretrained(model), "max_position_embeddings", 4096))


def _tokenizer(path: Path) -> Any:
    from transformers import AutoTokenizer

    from looprl.errors import ConfigError

    try:
        return AutoTokenizer.from_pretrained(str(path))
    except (OSError, ValueError) as e:
        raise ConfigError(f"no tokenizer in {path} ({type(e).__name__}); pass --tokenizer DIR "
                          "holding the served model's tokenizer files") from None


def _engine_options(pairs: list[str]) -> dict[str, Any]:
    """``-E KEY=VALUE`` pairs as keyword arguments; a value that parses as JSON is that value."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.isidentifier():
            raise typer.BadParameter(f"{pair!r} is not KEY=VALUE with a Python name as KEY",
                                     param_hint="--engine-option")
        try:
            out[key] = json.loads(value)
        except ValueError:
            out[key] = value
    return out


def _make_engines(name: str, specs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """One engine per arm, through the engine registry (built-ins and plugins)."""
    from looprl.inference import make_engine

    engines: dict[str, Any] = {}
    try:
        for arm, kwargs in specs.items():
            engines[arm] = make_engine(name, **kwargs)
    except BaseException as e:
        for started in engines.values():  # arm A's worker must not outlive B's failed start
            _close(started)
        if isinstance(e, TypeError):  # an engine option it does not take
            raise typer.BadParameter(f"engine {name!r}: {e}", param_hint="--engine-option") from None
        raise
    return engines


def _close(engine: Any) -> None:
    close = getattr(engine, "close", None)  # an in-process engine stops its decode thread / worker
    if close is not None:
        close()
