"""The logger seam: a real GRPOLoop writes metrics.jsonl, TensorBoard events and an offline W&B run
with the same per-step numbers; a resume rewinds what can be rewound; bad names are config errors."""

from __future__ import annotations

import doctest
import json
import struct
import time
from pathlib import Path
from typing import Any

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from looprl.errors import ConfigError
from looprl.trainer import loggers as loggers_mod
from looprl.trainer.config import LoopConfig
from looprl.trainer.loggers import make_loggers, read_metrics
from tests.dashboard.conftest import SKIPPED_STEP, write_grpo_run


def tb_scalars(run_dir: Path, tag: str) -> dict[int, float]:
    acc = EventAccumulator(str(run_dir / "tb"))
    acc.Reload()
    return {e.step: e.value for e in acc.Scalars(tag)}


def wandb_history(run_dir: Path) -> list[dict[str, Any]]:
    """The history rows of the offline W&B run under ``run_dir/wandb``, read from its transaction
    log (LevelDB log format: 32 KiB blocks of records ``crc u32, length u16, type u8, data``)."""
    from wandb.proto import wandb_internal_pb2 as pb

    (path,) = run_dir.glob("wandb/offline-run-*/run-*.wandb")
    data = path.read_bytes()
    assert data[:4] == b":W&B", "not a W&B transaction log"
    pos, buf, rows = 7, b"", []
    while pos + 7 <= len(data):
        left = 32768 - pos % 32768
        _crc, n, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if left < 7 or (n == 0 and kind == 0):  # block trailer / padding
            pos += left
            continue
        buf += data[pos + 7:pos + 7 + n]
        pos += 7 + n
        if kind in (1, 4):  # a full record, or the last piece of one
            rec = pb.Record()
            rec.ParseFromString(buf)
            buf = b""
            if rec.WhichOneof("record_type") == "history":
                rows.append({i.key or "/".join(i.nested_key): json.loads(i.value_json)
                             for i in rec.history.item})
    return rows


def test_doctests():
    assert doctest.testmod(loggers_mod).failed == 0


def test_loop_writes_jsonl_and_tensorboard(tmp_path: Path):
    run = write_grpo_run(tmp_path / "run", steps=3, cfg=LoopConfig(groups_per_step=2))
    rows = read_metrics(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3]
    tb = tb_scalars(run, "reward/total_mean")
    assert tb == pytest.approx({r["step"]: r["reward/total_mean"] for r in rows})
    # a step that trained on no token has no loss: a gap in TensorBoard, not the row's 0
    assert rows[SKIPPED_STEP - 1]["train/tokens"] == 0 and rows[SKIPPED_STEP - 1]["train/loss"] == 0
    assert tb_scalars(run, "train/loss") == pytest.approx(
        {r["step"]: r["train/loss"] for r in rows if r["step"] != SKIPPED_STEP})


@pytest.mark.slow  # W&B starts its own service process (~3-8 s)
def test_loop_writes_wandb_offline(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    run = write_grpo_run(tmp_path / "run", steps=2,
                         cfg=LoopConfig(groups_per_step=2, loggers=("wandb",)))
    rows = read_metrics(run / "metrics.jsonl")
    hist = wandb_history(run)
    assert [h["step"] for h in hist] == [1, 2]
    for h, r in zip(hist, rows, strict=True):
        assert h["reward/total_mean"] == pytest.approx(r["reward/total_mean"])
        assert "tasks" not in h  # only numbers go to trackers
    assert hist[0]["train/loss"] == pytest.approx(rows[0]["train/loss"])
    assert "train/loss" not in hist[SKIPPED_STEP - 1]  # skipped: not measured
    assert not (run / "tb").exists()  # not asked for
    # a second process resuming the run continues the same W&B run
    run_id = (run / "wandb_run_id").read_text().strip()
    # W&B names an offline run's directory by the second it started: a resume within the first
    # run's second would share its directory, and the two processes' runs would not show apart
    first = int(time.time())
    while int(time.time()) == first:
        time.sleep(0.05)
    lg = make_loggers(("wandb",), run)
    lg.close()
    assert (run / "wandb_run_id").read_text().strip() == run_id
    assert len(list(run.glob(f"wandb/offline-run-*-{run_id}"))) == 2


@pytest.mark.slow  # W&B starts its service before it reads the setting (~5 s)
def test_wandb_that_cannot_start_is_a_one_line_config_error(tmp_path: Path, monkeypatch):
    import wandb

    wandb.teardown()  # W&B reads its environment once per process: forget an earlier test's
    monkeypatch.setenv("WANDB_MODE", "bogus")
    monkeypatch.setenv("WANDB_SILENT", "true")
    with pytest.raises(ConfigError) as e:
        make_loggers(("wandb",), tmp_path)
    assert "\n" not in str(e.value) and "WANDB_MODE=offline" in str(e.value)


def test_rewind_forgets_lost_steps(tmp_path: Path):
    lg = make_loggers(("jsonl", "tensorboard"), tmp_path)
    for step in (1, 2, 3):
        lg.log(step, {"step": step, "train/loss": float(step), "tasks": ["a"]})
    lg.rewind(1)  # a resume from the step-1 checkpoint: steps 2 and 3 are trained again
    lg.log(2, {"step": 2, "train/loss": 20.0, "tasks": ["b"]})
    lg.close()
    assert [(r["step"], r["train/loss"]) for r in read_metrics(tmp_path / "metrics.jsonl")] == [
        (1, 1.0), (2, 20.0)]
    assert tb_scalars(tmp_path, "train/loss") == {1: 1.0, 2: 20.0}


class Recorder:
    """A tracker plugin, named by module:attr in the config."""

    seen: list[tuple[int, dict[str, Any]]] = []

    def __init__(self, run_dir: Path, *, run_name: str, config: Any) -> None:
        self.run_name = run_name

    def log(self, step: int, row: dict[str, Any]) -> None:
        Recorder.seen.append((step, dict(row)))

    def rewind(self, last_step: int) -> None:
        pass

    def close(self) -> None:
        pass


class NotALogger:
    def __init__(self, run_dir: Path, **kw: Any) -> None:
        pass


def test_plugin_logger_and_bad_names(tmp_path: Path):
    Recorder.seen.clear()
    run = write_grpo_run(tmp_path / "run", steps=2, cfg=LoopConfig(
        groups_per_step=2, loggers=("tests.trainer.test_loggers:Recorder",)))
    assert [s for s, _ in Recorder.seen] == [1, 2]
    assert Recorder.seen[-1][1] == read_metrics(run / "metrics.jsonl")[-1]
    with pytest.raises(ConfigError, match=r"unknown logger 'tensorbord' \(did you mean tensorboard\?\)"):
        make_loggers(("tensorbord",), tmp_path)
    with pytest.raises(ConfigError, match="has no log"):
        make_loggers(("tests.trainer.test_loggers:NotALogger",), tmp_path)
