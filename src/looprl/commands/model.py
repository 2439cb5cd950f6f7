"""``looprl model ...``: create, pretrain and serve the default model.

    looprl model init ~/.cache/looprl/models/default --size small
    looprl model pretrain ~/.cache/looprl/models/default --steps 300
    looprl model upcycle runs/quickstart/model_start runs/moe_start --experts 8 --top-k 2
    looprl model serve ~/.cache/looprl/models/default --port 8000 --api-key s3cret   # OpenAI API
    looprl model serve                  # the newest trained model: runs/<name>/model_rl
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from looprl import paths

app = typer.Typer(help="Create, pretrain and serve the default model.", no_args_is_help=True)
console = Console()


def _default_dir() -> Path:
    return paths.sub("models") / "default"


ModelDir = Annotated[Path | None, typer.Argument(help="model dir (default: $LOOPRL_HOME/models/default)")]


@app.command()
def init(out_dir: ModelDir = None,
         size: Annotated[str | None, typer.Option(
             help="a name in looprl.models.tiny.SIZES (default: its DEFAULT_SIZE)")] = None,
         seed: int = 0,
         corpus_chars: Annotated[int, typer.Option(
             help="Python source sampled for the tokenizer", min=1)] = 2_000_000,
         copy_circuit: Annotated[bool, typer.Option(
             help="plant an induction (copy) circuit at init: models.tiny.plant_copy_circuit")] = True,
         ) -> None:
    """Train the BPE tokenizer and save a freshly initialised default model (HF format)."""
    from looprl.models.loading import load_model
    from looprl.models.tiny import DEFAULT_SIZE, init_default_model
    path = init_default_model(out_dir or _default_dir(), size=size or DEFAULT_SIZE, seed=seed,
                              corpus_chars=corpus_chars, copy_circuit=copy_circuit)
    lm = load_model(path)
    console.print(f"saved {lm.model.config.model_type} model ({lm.num_params / 1e6:.2f}M params, "
                  f"vocab {len(lm.tokenizer)}) to {path}")


@app.command()
def pretrain(model_dir: ModelDir = None,
             steps: Annotated[int, typer.Option(min=1)] = 300,
             batch: Annotated[int, typer.Option(min=1)] = 8,
             seq_len: Annotated[int, typer.Option(min=2)] = 512,
             lr: float = 3e-3,
             threads: Annotated[int | None, typer.Option(min=1)] = None,
             bf16: Annotated[bool, typer.Option(help="bf16 autocast")] = False,
             out_dir: Annotated[Path | None, typer.Option(help="save elsewhere instead of in place")] = None,
             ) -> None:
    """Next-token pretraining on the source corpus: library code of pinned PyPI sdists
    (looprl.models.corpus), fetched on first use."""
    from looprl.models.pretrain import pretrain as run
    if not 0 < lr < float("inf"):
        raise typer.BadParameter(f"must be a finite number > 0, got {lr}", param_hint="--lr")
    r = run(model_dir or _default_dir(), steps=steps, batch=batch, seq_len=seq_len, lr=lr, bf16=bf16,
            out_dir=out_dir, num_threads=threads)
    console.print(f"loss {r.losses_S[0]:.3f} -> {r.final_loss:.3f} (val {r.val_loss:.3f}), "
                  f"{r.tokens_seen / r.wall_s:.0f} tok/s; saved {r.model_dir}, curve {r.loss_png}")


@app.command()
def upcycle(src: Annotated[Path, typer.Argument(help="a dense default model: a checkpoint dir or "
                                                "a run dir (its model_rl, else model_start)")],
            out_dir: Annotated[Path, typer.Argument(help="where the MoE is saved (HF format)")],
            experts: Annotated[int, typer.Option(min=1, max=255)] = 8,
            top_k: Annotated[int, typer.Option(min=1)] = 2,
            seed: int = 0) -> None:
    """Make a Mixtral MoE of a trained dense model, every expert a copy of its MLP (sparse
    upcycling): it starts as the dense model does, and RL trains it as any model."""
    from looprl.errors import ConfigError
    from looprl.models.loading import load_model, save_model
    from looprl.models.moe import upcycle as make
    from looprl.train.start import model_in

    path = model_in(src)
    if path is None:
        raise ConfigError(f"{src}: no model (no config.json, no model_rl/ or model_start/ with "
                          "one); give a checkpoint or a finished run's directory")
    if top_k > experts:
        raise typer.BadParameter(f"must be at most --experts ({experts}), got {top_k}",
                                 param_hint="--top-k")
    dense = load_model(path)
    try:
        moe = make(dense.model, experts, top_k, seed=seed)
    except ValueError as e:
        raise ConfigError(f"{path}: {e}") from None
    save_model(moe, dense.tokenizer, out_dir)
    active = dense.num_params + (top_k - 1) * sum(
        p.numel() for layer in dense.model.model.layers for p in layer.mlp.parameters())
    console.print(f"saved a Mixtral of {path}: {experts} experts, top-{top_k}, "
                  f"{sum(p.numel() for p in moe.parameters()) / 1e6:.2f}M params "
                  f"({active / 1e6:.2f}M active) to {out_dir}", soft_wrap=True)  # paths stay whole


def _trained_model(runs: Path) -> Path:
    """What ``model serve`` with no model serves: the newest run's trained model
    (``runs/<name>/model_rl``), else the default model directory; neither: how to name one."""
    from looprl.rundir import RunDir

    trained = [RunDir(d).model_rl for d in runs.iterdir() if RunDir(d).model_rl.is_dir()] \
        if runs.is_dir() else []
    if trained:
        newest = max(trained, key=lambda p: p.stat().st_mtime)
        console.print(f"serving the newest trained model, {newest} (pass a model dir to pick "
                      "another)")
        return newest
    if _default_dir().is_dir():
        return _default_dir()
    raise typer.BadParameter(
        f"no model to serve: no {runs}/<name>/model_rl (where `looprl train` saves the model it "
        f"trained) and no {_default_dir()}; pass a model dir or hub id, e.g. looprl model serve "
        "runs/quickstart/model_rl", param_hint="MODEL_DIR")


def _port_free(host: str, port: int) -> None:
    """Fail before loading the model (and before any banner) when ``port`` is taken."""
    import socket

    if port == 0:
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as e:
            raise typer.BadParameter(f"cannot listen on {host}:{port} ({e.strerror}): pick "
                                     "another with --port", param_hint="--port") from None


def _loopback(host: str) -> bool:
    import ipaddress

    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve to any interface
        return False


@app.command()
def serve(model_dir: ModelDir = None,
          host: Annotated[str, typer.Option(help="bind address (without an API key: loopback "
                                                 "only)")] = "127.0.0.1",
          port: Annotated[int, typer.Option(min=0, max=65535)] = 8000,
          dtype: str = "float32",
          name: Annotated[str, typer.Option(help="the model name clients send")] = "looprl",
          api_key: Annotated[str | None, typer.Option(
              envvar="LOOPRL_API_KEY", show_envvar=True,
              help="bearer key every request must carry (none: open, loopback only)")] = None,
          max_batch: Annotated[int, typer.Option(min=1, help="sequences decoded together")] = 64,
          drain: Annotated[float, typer.Option(
              help="on SIGTERM: seconds running requests may finish", min=0.1)] = 30.0,
          runs: Annotated[Path, typer.Option(
              help="without MODEL_DIR: serve the newest RUNS/<name>/model_rl")] = Path("runs"),
          tool_format: Annotated[str | None, typer.Option(
              help="tool-call format of the chat template: hermes, qwen3_coder, llama3, "
                   "mistral, mistral_v11 or harmony (default: probed from the template)")] = None,
          engine_name: Annotated[str, typer.Option(
              "--engine", help="what decodes: torch (in this process) or vllm (vLLM in its own "
                               "venv: `make vllm`)")] = "torch",
          ) -> None:
    """Serve a model through an OpenAI-compatible API: chat with tool calls and streaming,
    completions, /health, /v1/models (inference/openai_server.py). Without MODEL_DIR: the model
    the newest `looprl train` run trained (runs/<name>/model_rl). Tool calls are read in the
    format the model's chat template writes (docs/formats.md). `--engine vllm` decodes on vLLM
    (its CPU build here, `make vllm`) behind the same API, weight updates included."""
    if not api_key and not _loopback(host):
        raise typer.BadParameter(f"without an API key the server is open to anyone who reaches "
                                 f"{host}: pass --api-key (or set LOOPRL_API_KEY), or bind "
                                 "127.0.0.1", param_hint="--host")
    from looprl.asgi import run
    from looprl.chat.tool_formats import FORMATS
    from looprl.inference.openai_server import ServedEngine, create_app

    if tool_format is not None and tool_format not in FORMATS:
        raise typer.BadParameter(f"unknown tool format {tool_format!r}; use one of "
                                 f"{', '.join(FORMATS)}", param_hint="--tool-format")
    if engine_name not in ("torch", "vllm"):
        raise typer.BadParameter(f"unknown engine {engine_name!r}; use torch or vllm",
                                 param_hint="--engine")
    _port_free(host, port)
    path = model_dir or _trained_model(runs)
    engine: ServedEngine
    if engine_name == "vllm":
        from transformers import AutoConfig

        from looprl.inference.vllm_engine import VLLMEngine

        engine = VLLMEngine(str(path), dtype=dtype, max_num_seqs=max_batch,
                            max_model_len=AutoConfig.from_pretrained(path).max_position_embeddings)
    else:
        from looprl.inference.torch_engine import TorchEngine

        engine = TorchEngine.from_path(path, dtype=dtype, max_batch=max_batch)
    try:
        app_ = create_app(engine, name, api_key=api_key, drain_s=drain, tool_format=tool_format)
    except ValueError as e:
        engine.close()
        raise typer.BadParameter(str(e), param_hint="--tool-format") from None
    access = ("API key required" if api_key else
              "NO API key: open to every user and process on this machine")
    calls = (f"{app_.state.tool_format} tool calls" if app_.state.tool_format
             else "no chat template: completions only")
    console.print(f"looprl model server on http://{host}:{port}/v1, model {name!r} "
                  f"({engine.max_len} tokens of context, {calls}); {access}")
    try:
        run(app_, host=host, port=port, drain=app_.state.drain, drain_s=drain)
    finally:
        engine.close()
