"""``looprl model ...``: create, pretrain and serve the default model.

    looprl model init ~/.cache/looprl/models/default --size small
    looprl model pretrain ~/.cache/looprl/models/default --steps 300
    looprl model serve ~/.cache/looprl/models/default --port 8000   # OpenAI-compatible API
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from looprl import paths
from looprl.models.tiny import DEFAULT_SIZE, SIZES

app = typer.Typer(help="Create, pretrain and serve the default model.", no_args_is_help=True)
console = Console()


def _default_dir() -> Path:
    return paths.sub("models") / "default"


ModelDir = Annotated[Path | None, typer.Argument(help="model dir (default: $LOOPRL_HOME/models/default)")]


@app.command()
def init(out_dir: ModelDir = None,
         size: Annotated[str, typer.Option(help=f"one of {sorted(SIZES)}")] = DEFAULT_SIZE,
         seed: int = 0,
         corpus_chars: Annotated[int, typer.Option(help="Python source sampled for the tokenizer")] = 2_000_000,
         copy_circuit: Annotated[bool, typer.Option(
             help="plant an induction (copy) circuit at init: models.tiny.plant_copy_circuit")] = True,
         ) -> None:
    """Train the BPE tokenizer and save a freshly initialised default model (HF format)."""
    from looprl.models.loading import load_model
    from looprl.models.tiny import init_default_model
    path = init_default_model(out_dir or _default_dir(), size=size, seed=seed,
                              corpus_chars=corpus_chars, copy_circuit=copy_circuit)
    lm = load_model(path)
    console.print(f"saved {lm.model.config.model_type} model ({lm.num_params / 1e6:.2f}M params, "
                  f"vocab {len(lm.tokenizer)}) to {path}")


@app.command()
def pretrain(model_dir: ModelDir = None, steps: int = 300, batch: int = 8, seq_len: int = 512,
             lr: float = 3e-3, threads: int | None = None,
             bf16: Annotated[bool, typer.Option(help="bf16 autocast")] = False,
             out_dir: Annotated[Path | None, typer.Option(help="save elsewhere instead of in place")] = None,
             ) -> None:
    """Next-token pretraining on the Python source installed in this venv."""
    from looprl.models.pretrain import pretrain as run
    r = run(model_dir or _default_dir(), steps=steps, batch=batch, seq_len=seq_len, lr=lr, bf16=bf16,
            out_dir=out_dir, num_threads=threads)
    console.print(f"loss {r.losses_S[0]:.3f} -> {r.final_loss:.3f} (val {r.val_loss:.3f}), "
                  f"{r.tokens_seen / r.wall_s:.0f} tok/s; saved {r.model_dir}, curve {r.loss_png}")


@app.command()
def serve(model_dir: ModelDir = None, host: str = "127.0.0.1", port: int = 8000,
          dtype: str = "float32", name: str = "looprl") -> None:
    """Serve the model through an OpenAI-compatible API (/v1/completions, /v1/chat/completions)."""
    import uvicorn

    from looprl.inference.openai_server import create_app
    from looprl.inference.torch_engine import TorchEngine
    engine = TorchEngine.from_path(model_dir or _default_dir(), dtype=dtype)
    try:
        uvicorn.run(create_app(engine, name), host=host, port=port)
    finally:
        engine.close()
