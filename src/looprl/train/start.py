"""Where ``looprl train`` starts (``model.start``): another run's model, or the default model
from scratch.

    origin = resolve_start(cfg, Path("runs"))  # ModelStart(kind="quickstart", path=...model_rl)

A user's own run is minutes of RL on a few dozen tasks: from scratch the default model learns
nothing there, so ``configs/train_cpu.toml`` starts (``auto``) from the quickstart's model when
``make quickstart`` has made one, and says how to get one when it has not.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from looprl.errors import ConfigError
from looprl.models.config import SIZES
from looprl.rundir import RunDir
from looprl.train.config import START_KINDS, TrainConfig
from looprl.train.stages import check_model_path, console, has_chat_template

QUICKSTART_RUN = "quickstart"
"""The quickstart preset's run name (``name`` in ``configs/quickstart.toml``): its run directory
under the runs root is where ``auto`` and ``quickstart`` look."""

_SHAPE = {"hidden_size": "hidden", "num_hidden_layers": "layers",
          "num_attention_heads": "heads", "num_key_value_heads": "kv_heads"}
"""HF config keys of the default model's shape, and ``ModelSize``'s names for them."""


@dataclass(frozen=True)
class ModelStart:
    """The resolved start: ``kind`` is scratch (the default model, pretrained by this run),
    quickstart (the quickstart run's model), dir (``model.start`` names a run or a checkpoint)
    or path (``model.path``, trained as it is); ``path`` is the checkpoint, None for scratch."""

    kind: str
    path: Path | None

    def to_json(self) -> dict[str, str]:
        return {"kind": self.kind, "path": str(self.path) if self.path else ""}

    @classmethod
    def from_json(cls, d: dict[str, str]) -> ModelStart:
        return cls(d["kind"], Path(d["path"]) if d["path"] else None)

    def describe(self) -> str:
        """One line for the console and the report."""
        if self.path is None:
            return "the default model from scratch (pretrained and SFT'd by this run)"
        return f"{self.kind} checkpoint {self.path}"


def run_model(run: Path) -> Path | None:
    """The model a run made: ``model_rl`` once its RL finished, else ``model_start`` once its
    SFT did (both are saved whole or not at all: ``stages.save_model``); None before that."""
    rd = RunDir(run)
    return next((d for d in (rd.model_rl, rd.model_start) if (d / "config.json").is_file()), None)


def resolve_start(cfg: TrainConfig, runs_root: Path) -> ModelStart:
    """``model.start`` as a checkpoint (checked to fit the config) or scratch; ``auto`` without a
    quickstart model prints one line saying so and how to get one."""
    start = cfg.model.start
    if cfg.model.path:  # config.py allows only auto or scratch beside it
        from looprl.models.hub import resolve_model_path

        check_model_path(cfg)
        return ModelStart("path", resolve_model_path(cfg.model.path))
    if start == "scratch":
        return ModelStart("scratch", None)
    quick = runs_root / QUICKSTART_RUN
    if start in ("auto", "quickstart"):
        found = run_model(quick)
        if found is None and start == "quickstart":
            raise ConfigError(f"model.start=quickstart: {quick} holds no model yet; run `make "
                              "quickstart` first, or set model.start=auto (scratch until then)")
        if found is None:
            console.print(f"model.start=auto: no quickstart model in {quick}, so the default model starts "
                  "from scratch and learns little in minutes; for a competent start run `make "
                  "quickstart` first (then this run starts from its model)", soft_wrap=True)
            return ModelStart("scratch", None)
        origin = ModelStart("quickstart", found)
    else:
        origin = ModelStart("dir", _named_model(Path(start).expanduser()))
    check_fits(cfg, origin.path)  # type: ignore[arg-type]  # a checkpoint kind has a path
    return origin


def demos_config(cfg: TrainConfig, origin: ModelStart) -> TrainConfig:
    """``cfg`` with no synthetic demos when ``origin`` is another run's default model: its SFT
    had them from the same corpus already (``model.start``'s docstring); the oracle's stay."""
    if origin.kind in ("scratch", "path") or not cfg.demos.synthetic:
        return cfg
    console.print(f"SFT demos: the oracle's on the train tasks only; the {origin.kind} model had "
                  f"synthetic ones already (demos.synthetic={cfg.demos.synthetic} skipped)")
    return dataclasses.replace(cfg, demos=dataclasses.replace(cfg.demos, synthetic=0))


def model_in(where: Path) -> Path | None:
    """The checkpoint ``where`` names: itself when it holds weights beside a ``config.json`` (a
    run directory has a ``config.json`` too, the run's), else its run's model (``run_model``)."""
    if (where / "config.json").is_file() and any(where.glob("*.safetensors")):
        return where
    return run_model(where) if where.is_dir() else None


def _named_model(where: Path) -> Path:
    """``model.start=DIR``: a checkpoint directory, or a run directory's model (``run_model``)."""
    if not where.is_dir():
        raise ConfigError(f"model.start={where}: no such directory; give a run directory "
                          "(runs/NAME) or a checkpoint (runs/NAME/model_rl), or one of "
                          f"{', '.join(START_KINDS)}")
    found = model_in(where)
    if found is None:
        raise ConfigError(f"model.start={where} holds no model (no config.json, no model_rl/ or "
                          "model_start/ with one); give a finished run's directory or its "
                          "model_rl, or model.start=scratch")
    return found


def check_fits(cfg: TrainConfig, path: Path) -> None:
    """The checkpoint at ``path`` is a default model of ``model.size`` with a tokenizer that
    fits its embedding and a chat template, and carries the MTP heads the config asks for:
    else one line saying how to fix it."""
    try:
        hf = json.loads((path / "config.json").read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(f"model.start: {path}/config.json is unreadable ({e}); give a "
                          "checkpoint saved by a looprl run, or model.start=scratch") from None
    want = SIZES[cfg.model.size]
    shape = {name: hf.get(key) for key, name in _SHAPE.items()}
    if any(getattr(want, name) != v for name, v in shape.items()):
        sizes = [s for s, z in SIZES.items() if all(getattr(z, n) == v for n, v in shape.items())]
        fix = f"set model.size={sizes[0]}" if sizes else "give a default model's checkpoint"
        raise ConfigError(f"model.start: {path} is not a model.size={cfg.model.size} default "
                          f"model ({', '.join(f'{n} {v}' for n, v in shape.items())}); {fix}, "
                          "use model.path for another model, or model.start=scratch")
    if not has_chat_template(path) or not (path / "tokenizer.json").is_file():
        raise ConfigError(f"model.start: {path} has no tokenizer with a chat template; give a "
                          "checkpoint saved by a looprl run (its model_rl), or model.start=scratch")
    tok = json.loads((path / "tokenizer.json").read_text())
    vocab = tok.get("model", {}).get("vocab", {})  # BPE's a dict, Unigram's a list
    ids = [*(vocab.values() if isinstance(vocab, dict) else range(len(vocab))),
           *(t["id"] for t in tok.get("added_tokens", []))]
    if max(ids, default=-1) >= int(hf.get("vocab_size", 0)):
        raise ConfigError(f"model.start: {path}'s tokenizer has ids up to {max(ids)} but the "
                          f"model's embedding {hf.get('vocab_size')} rows: not one model; give "
                          "a checkpoint saved by a looprl run, or model.start=scratch")
    if cfg.model.experimental.mtp_heads and not (path / "mtp_config.json").is_file():
        raise ConfigError(f"model.start: {path} carries no MTP heads (they are distilled in "
                          "pretraining, which a checkpoint start skips); set "
                          "model.experimental.mtp_heads=0 or model.start=scratch")
