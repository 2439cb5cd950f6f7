"""The policies directory: the versions a real-time cycle made and the pointers serve follows.

    ref = read_policy("runs/rt/policies")    # PolicyRef(path=.../v0003, version=3)
    promote("runs/rt/policies", 4)           # current.json -> v0004 (atomic)
    offer_candidate("runs/rt/policies", 5, "exp-5", 0.5)   # candidate.json: A/B arm B

Layout of ``OUT``: ``vNNNN/`` (HF model directories, each with ``looprl_policy.json``: version,
parent, cycle, sessions; and ``optimizer.pt``, the Adam state its training left), ``current.json``
(the version users get) and ``candidate.json`` (the version an A/B offers as arm B). ``looprl
serve --model OUT --watch S`` re-reads both pointers, so a promotion or an offer goes live
without a restart. Every pointer is written to a temporary file and renamed over the old one, so
a reader sees the old pointer or the new one, never half of one.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from looprl.errors import ConfigError

POINTER = "current.json"
POLICY_META = "looprl_policy.json"
OPTIMIZER_FILE = "optimizer.pt"
"""Beside a candidate's weights: the Adam state its training left (``feedback.update``)."""
CANDIDATE = "candidate.json"
"""``OUT/candidate.json``: the candidate a serve with this policies dir A/B tests as arm B."""


@dataclass(frozen=True)
class PolicyRef:
    """A servable policy: an HF model directory and its version number."""

    path: Path
    version: int


def read_policy(path: str | Path) -> PolicyRef:
    """The policy at ``path``: a policies dir with ``current.json``, or a model dir."""
    p = Path(path).expanduser()
    if (p / POINTER).is_file():
        ptr = json.loads((p / POINTER).read_text())
        return PolicyRef((p / ptr["path"]).resolve(), int(ptr["version"]))
    if (p / "config.json").is_file():
        meta = p / POLICY_META
        version = int(json.loads(meta.read_text())["version"]) if meta.is_file() else 0
        return PolicyRef(p.resolve(), version)
    raise ConfigError(f"{p} is neither a model directory (config.json) nor a policies directory "
                      f"({POINTER}); pass --model DIR of an HF checkpoint (looprl model init)")


def current_policy(model: str | Path, out: str | Path) -> PolicyRef:
    """``OUT``'s current policy, or ``model`` before the first promotion."""
    o = Path(out).expanduser()
    return read_policy(o) if (o / POINTER).is_file() else read_policy(model)


def _write_pointer(path: Path, pointer: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(pointer))
    os.replace(tmp, path)


def _version_dir(out: Path, version: int) -> str:
    """``vNNNN``, the name of a saved version under ``out``; refused when there is none."""
    name = f"v{version:04d}"
    if not (out / name / "config.json").is_file():
        have = sorted(d.name for d in out.glob("v[0-9]*") if d.is_dir()) if out.is_dir() else []
        raise ConfigError(f"no candidate {out / name}; versions in {out}: {have or 'none'}")
    return name


def promote(out: str | Path, version: int) -> PolicyRef:
    """Point ``OUT/current.json`` at ``OUT/vNNNN`` (atomic rename)."""
    o = Path(out).expanduser()
    name = _version_dir(o, version)
    _write_pointer(o / POINTER, {"version": version, "path": name, "promoted_at": time.time()})
    return PolicyRef((o / name).resolve(), version)


def offer_candidate(out: str | Path, version: int, experiment: str, split_b: float) -> PolicyRef:
    """Point ``OUT/candidate.json`` at ``OUT/vNNNN`` for an A/B test on ``split_b`` of users."""
    o = Path(out).expanduser()
    name = _version_dir(o, version)
    if not 0.0 <= split_b <= 1.0:
        raise ConfigError(f"split_b must be in [0, 1] (the share of users on arm B), got {split_b}")
    _write_pointer(o / CANDIDATE, {"version": version, "path": name, "experiment": experiment,
                                   "split_b": split_b, "offered_at": time.time()})
    return PolicyRef((o / name).resolve(), version)


def withdraw_candidate(out: str | Path) -> None:
    """Remove ``OUT/candidate.json`` (nothing to do when there is none)."""
    (Path(out).expanduser() / CANDIDATE).unlink(missing_ok=True)


def read_candidate(out: str | Path) -> tuple[PolicyRef, str, float] | None:
    """The offered candidate, its experiment and split_b; None when none is offered."""
    p = Path(out).expanduser() / CANDIDATE
    try:
        ptr = json.loads(p.read_text())
        return (PolicyRef((p.parent / ptr["path"]).resolve(), int(ptr["version"])),
                str(ptr["experiment"]), float(ptr["split_b"]))
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"{p} is not a candidate pointer ({type(e).__name__}: {e}); rewrite it "
                          "with offer_candidate or remove it") from None


def init_policies(out: str | Path, model: str | Path) -> PolicyRef:
    """Create ``OUT/current.json`` pointing at ``model`` (absolute path) unless it exists."""
    o = Path(out).expanduser()
    if (o / POINTER).is_file():
        return read_policy(o)
    ref = read_policy(model)  # a policies dir given as the model: its current model dir
    o.mkdir(parents=True, exist_ok=True)
    _write_pointer(o / POINTER, {"version": ref.version, "path": str(ref.path),
                                 "promoted_at": time.time()})
    return ref


def next_version(out: Path, current: int) -> int:
    """The version a new candidate gets: above ``current`` and every one saved under ``out``."""
    used = [int(d.name[1:]) for d in out.glob("v[0-9]*") if d.name[1:].isdigit()]
    return max([current, *used]) + 1


def save_candidate(model: Any, tokenizer: Any, out: Path, version: int, meta: dict[str, Any],
                   optimizer_state: dict[str, Any] | None = None) -> Path:
    """Save ``OUT/vNNNN`` (weights, tokenizer, ``looprl_policy.json``, the optimizer state when
    given), written beside it and renamed into place: a half-saved version is never seen."""
    final = out / f"v{version:04d}"
    tmp = out / f".v{version:04d}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    if optimizer_state is not None:
        import torch

        torch.save(optimizer_state, tmp / OPTIMIZER_FILE)
    (tmp / POLICY_META).write_text(json.dumps({"version": version, **meta}, indent=1))
    os.replace(tmp, final)
    return final
