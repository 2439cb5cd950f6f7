"""Checkpoint and resume: model, optimizer, RNG states, data position, weight version, config.

    save_checkpoint(RunDir(run_dir).ckpt, step, model, opt, sampler_state={"next": i},
                    weight_version=v, config=cfg)
    path = latest_checkpoint(RunDir(run_dir).ckpt)
    if path: r = load_checkpoint(path, model, opt)    # restores RNGs; r.step, r.sampler_state, ...

Layout: ``<root>/step_00000012/`` holding ``model.safetensors``, ``optimizer.pt``, ``rng.pt``
(torch CPU generator) and ``meta.json`` (step, data position, weight-store version, python and
numpy RNG states, resolved config, the tokenizer's fingerprint: a checkpoint is not loaded into a
model with another tokenizer). A checkpoint is written to a temporary directory, its files
and the directory fsynced, then renamed into place (and the parent fsynced), so a process killed
or a machine losing power mid-save leaves either the previous checkpoint or the new one — never a
half-written one (temporary leftovers are ignored and cleaned). Saving a step that already exists
(e.g. a final save right after a periodic one) moves the old one aside first and puts it back if
the save is interrupted; pruning removes ``meta.json`` first, so a half-deleted checkpoint is
never taken for a complete one.

The contract for exact resume: save after an optimizer step with ``sampler_state`` describing
the next batch to train on; after loading, continue from it. Batches trained after the last
checkpoint by a killed process are lost with their weights, and trained again (once) on resume.
A trainer that also publishes to a weight store reconciles the store with the checkpoint on
resume (``GRPOLoop.resume``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import safetensors.torch
import torch
from torch import nn

from looprl.errors import ConfigError
from looprl.models.fingerprint import model_fingerprint

_STEP_DIR = re.compile(r"^step_(\d{8})$")
_ASIDE = ".replaced-"


@dataclass(frozen=True)
class Resumed:
    """What ``load_checkpoint`` restored besides the model and optimizer."""

    path: Path
    step: int
    sampler_state: dict[str, Any]
    weight_version: int | None
    config: dict[str, Any]
    discarded_versions: tuple[int, ...] = ()
    """Weight versions published after this checkpoint, removed from the store on resume
    (``GRPOLoop.resume``; empty from ``load_checkpoint``)."""


def _unwrap(model: nn.Module) -> nn.Module:
    return model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model


def capture_rng() -> dict[str, Any]:
    """Python and numpy RNG states as JSON-able values (torch's goes to rng.pt)."""
    py = random.getstate()
    np_state = np.random.get_state()
    return {"python": [py[0], list(py[1]), py[2]],
            "numpy": [np_state[0], np_state[1].tolist(), *map(float, np_state[2:])]}


def restore_rng(state: dict[str, Any], torch_state: torch.Tensor | None) -> None:
    v, internal, gauss = state["python"]
    random.setstate((v, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.array(keys, dtype=np.uint32), int(pos), int(has_gauss), cached))
    if torch_state is not None:
        torch.set_rng_state(torch_state)


def _config_dict(config: Any) -> dict[str, Any]:
    if config is None:
        return {}
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        return json.loads(json.dumps(dataclasses.asdict(config), default=str))
    return json.loads(json.dumps(dict(config), default=str))


def _fsync(path: Path) -> None:
    """Flush a file's or a directory's entries to disk (a rename is durable once its directory is)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_checkpoint(root: str | Path, step: int, model: nn.Module, optimizer: torch.optim.Optimizer,
                    *, sampler_state: dict[str, Any] | None = None,
                    weight_version: int | None = None, config: Any = None,
                    keep: int | None = 3) -> Path:
    """Atomically write checkpoint ``step`` under ``root``; keep the newest ``keep`` of them."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step:08d}"
    tmp = root / f".tmp-step_{step:08d}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    safetensors.torch.save_model(_unwrap(model), str(tmp / "model.safetensors"))
    torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
    torch.save({"torch": torch.get_rng_state()}, tmp / "rng.pt")
    meta = {"step": step, "sampler_state": sampler_state or {}, "weight_version": weight_version,
            "rng": capture_rng(), "config": _config_dict(config),
            "tokenizer": model_fingerprint(model)}
    (tmp / "meta.json").write_text(json.dumps(meta))
    for f in (*tmp.iterdir(), tmp):
        _fsync(f)
    aside = root / f"{_ASIDE}{final.name}"
    shutil.rmtree(aside, ignore_errors=True)  # superseded by this save
    if final.exists():  # killed between these renames: latest_checkpoint puts it back
        os.replace(final, aside)
    os.replace(tmp, final)
    _fsync(root)
    shutil.rmtree(aside, ignore_errors=True)
    if keep is not None:
        for old in _complete(root)[:-keep]:
            _remove(old)
    return final


def _remove(path: Path) -> None:
    (path / "meta.json").unlink(missing_ok=True)  # no longer complete, whatever else survives
    shutil.rmtree(path, ignore_errors=True)


def _complete(root: Path) -> list[Path]:
    """Finished checkpoints, oldest first (temporary dirs of interrupted saves are skipped)."""
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if _STEP_DIR.match(p.name) and (p / "meta.json").exists()]
    return sorted(found, key=lambda p: int(_STEP_DIR.match(p.name).group(1)))  # type: ignore[union-attr]


def latest_checkpoint(root: str | Path) -> Path | None:
    """The newest complete checkpoint under ``root``; removes leftovers of interrupted saves."""
    root = Path(root)
    if root.is_dir():
        for p in root.glob(".tmp-step_*"):
            shutil.rmtree(p, ignore_errors=True)
        for p in root.glob(f"{_ASIDE}step_*"):  # a re-save killed between its two renames
            final = root / p.name.removeprefix(_ASIDE)
            if final.exists():
                shutil.rmtree(p, ignore_errors=True)
            else:
                os.replace(p, final)
    done = _complete(root)
    return done[-1] if done else None


def load_checkpoint(path: str | Path, model: nn.Module, optimizer: torch.optim.Optimizer | None = None,
                    *, restore_rngs: bool = True) -> Resumed:
    """Load weights (and optimizer, RNGs) from ``path`` in place; return the rest."""
    path = Path(path)
    if not (path / "meta.json").exists():
        raise ConfigError(f"{path} is not a complete checkpoint (no meta.json); use "
                          "latest_checkpoint(dir) to find the newest complete one")
    meta = json.loads((path / "meta.json").read_text())
    saved, ours = meta.get("tokenizer"), model_fingerprint(model)
    if saved and ours and saved != ours:
        raise ConfigError(f"checkpoint {path} was trained with tokenizer {saved}, this model's "
                          f"is {ours}: resume it with the model (and tokenizer) it was made from")
    try:
        missing, unexpected = safetensors.torch.load_model(
            _unwrap(model), str(path / "model.safetensors"), strict=False)
    except RuntimeError as e:  # same names, other shapes
        missing, unexpected = [str(e).splitlines()[0]], []
    if missing or unexpected:
        raise ConfigError(f"checkpoint {path} does not fit this model: missing {sorted(missing)[:5]}, "
                          f"unexpected {sorted(unexpected)[:5]}; build the model from the saved config")
    if optimizer is not None:
        optimizer.load_state_dict(torch.load(path / "optimizer.pt", weights_only=True))
    if restore_rngs:
        restore_rng(meta["rng"], torch.load(path / "rng.pt", weights_only=True)["torch"])
    return Resumed(path, int(meta["step"]), meta["sampler_state"], meta["weight_version"],
                   meta["config"])
