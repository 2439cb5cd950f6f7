"""HF's tqdm bars ("Loading weights", "Writing model shards") stay out of looprl's output unless
asked for with ``LOOPRL_HF_PROGRESS=1`` or ``looprl --debug`` (``models.loading.hf_progress_bars``)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from transformers.utils import logging as hf_logging

from looprl.models.loading import hf_progress_bars
from tests.trainer.helpers import segment, tiny_llama, trajectory


def test_the_switch_reads_the_environment(monkeypatch):
    monkeypatch.delenv("LOOPRL_DEBUG", raising=False)
    monkeypatch.delenv("LOOPRL_HF_PROGRESS", raising=False)
    try:
        assert hf_progress_bars() is False and not hf_logging.is_progress_bar_enabled()
        monkeypatch.setenv("LOOPRL_HF_PROGRESS", "1")
        assert hf_progress_bars() is True and hf_logging.is_progress_bar_enabled()
        monkeypatch.setenv("LOOPRL_HF_PROGRESS", "0")
        monkeypatch.setenv("LOOPRL_DEBUG", "1")
        assert hf_progress_bars() is True
    finally:
        monkeypatch.undo()
        hf_progress_bars()


@pytest.mark.slow
def test_a_command_that_loads_and_saves_a_model_prints_no_bars_unless_debugging(tmp_path):
    from looprl.models.tokenizer import build_tokenizer

    model = tmp_path / "m"
    tiny_llama(vocab=512).save_pretrained(model)
    build_tokenizer(None).save_pretrained(model)
    data = tmp_path / "t.jsonl"
    data.write_text(trajectory([segment([1, 2, 3], [40, 41])], 1.0).to_json() + "\n")
    env = {k: v for k, v in os.environ.items() if k not in ("LOOPRL_DEBUG", "LOOPRL_HF_PROGRESS")}

    def sft(*flags: str) -> str:
        r = subprocess.run([sys.executable, "-c", "from looprl.cli import app; app()", *flags,
                            "trainer", "sft", str(model), str(data), "--out", str(tmp_path / "o"),
                            "-o", "experimental.progress=false"], capture_output=True, text=True, env=env,
                           timeout=300)
        assert r.returncode == 0, r.stderr
        return r.stdout + r.stderr

    quiet = sft()
    assert "Loading weights" not in quiet and "Writing model shards" not in quiet
    assert "sft: " in quiet  # it did load, train and save
    loud = sft("--debug")
    assert "Loading weights" in loud and "Writing model shards" in loud
