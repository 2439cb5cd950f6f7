"""``looprl trainer``: supervised fine-tuning from the command line (GRPO runs live in the loop).

    looprl trainer sft MODEL_DIR trajectories.jsonl --out OUT_DIR -o epochs=2 -o lr=1e-4

Reads ``Trajectory`` records (one JSON per line, as the rollout runner and the oracle write them),
refuses them when another tokenizer made their ids (``looprl.models.fingerprint``), trains on
their model tokens, saves the model (and tokenizer) with ``save_pretrained`` and the
resolved config plus the per-step losses next to it.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from looprl.config import load_config, save_config
from looprl.errors import ConfigError
from looprl.records import read_trajectories

app = typer.Typer(help="Supervised fine-tuning on harness trajectories.", no_args_is_help=True)
console = Console()


@app.callback()
def _group() -> None:
    """Supervised fine-tuning on harness trajectories."""


@app.command("sft")
def sft_cmd(
    model_dir: Annotated[Path, typer.Argument(help="HF model directory (config.json + safetensors).",
                                              exists=True, file_okay=False)],
    data: Annotated[Path, typer.Argument(help="JSONL of Trajectory records.", exists=True,
                                         dir_okay=False)],
    out: Annotated[Path, typer.Option("--out", help="Where to save the fine-tuned model.",
                                      file_okay=False)],
    config: Annotated[Path | None, typer.Option("--config", help="TOML with SFTConfig fields.",
                                                exists=True, dir_okay=False)] = None,
    override: Annotated[list[str] | None, typer.Option("-o", help="key=value, e.g. -o lr=1e-4")] = None,
) -> None:
    """Fine-tune MODEL_DIR on the model tokens of the trajectories in DATA."""
    from looprl.models.fingerprint import check_trajectories, model_fingerprint
    from looprl.models.loading import load_model
    from looprl.trainer.config import SFTConfig
    from looprl.trainer.sft import sft

    cfg = load_config(SFTConfig, config, override or [])
    trajectories = read_trajectories(data)  # a bad file fails before the model loads
    if not trajectories:
        raise ConfigError(f"{data} holds no trajectories; write one Trajectory.to_json() per line")
    lm = load_model(model_dir)
    unstamped = check_trajectories(trajectories, model_fingerprint(lm.model),
                                   vocab_size=lm.model.config.vocab_size, source=str(data))
    if unstamped:
        console.print(f"[yellow]warning: {unstamped} of {len(trajectories)} trajectories record no "
                      "tokenizer (older files): make sure this model's tokenizer made them[/]")
    pad = lm.tokenizer.pad_token_id
    if pad is not None and pad != cfg.experimental.pad_id:
        cfg = dataclasses.replace(cfg, experimental=dataclasses.replace(cfg.experimental,
                                                                        pad_id=int(pad)))
    res = sft(lm.model, trajectories, cfg)
    out.mkdir(parents=True, exist_ok=True)
    lm.model.save_pretrained(out)
    lm.tokenizer.save_pretrained(out)
    save_config(cfg, out / "sft_config.json")
    (out / "sft_losses.json").write_text(json.dumps(res.losses))
    console.print(f"sft: {res.steps} steps, {res.tokens} tokens, loss {res.losses[0]:.3f} -> "
                  f"{res.losses[-1]:.3f} in {res.wall_s:.1f}s; saved {out}")
