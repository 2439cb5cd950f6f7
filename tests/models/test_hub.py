"""Hub ids as model paths, resolved offline through a hub cache the tests build (``models.hub``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from looprl.errors import ConfigError
from looprl.models.hub import is_hub_id, resolve_model_path
from looprl.models.loading import load_model
from looprl.models.tokenizer import build_tokenizer

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def cache_model(cache: Path, repo: str, commit: str = COMMIT, ref: str = "main") -> Path:
    """A tiny model saved into the hub cache's layout (``models--org--name``: ``refs/<ref>``
    naming the commit, its files under ``snapshots/<commit>``), as a download leaves it."""
    root = cache / f"models--{repo.replace('/', '--')}"
    snap = root / "snapshots" / commit
    tok = build_tokenizer(None)
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=1,
                                 num_attention_heads=4, num_key_value_heads=2,
                                 intermediate_size=64)).save_pretrained(snap)
    tok.save_pretrained(snap)
    (root / "refs").mkdir(parents=True, exist_ok=True)
    (root / "refs" / ref).write_text(commit)
    return snap


@pytest.fixture
def hub_cache(tmp_path, monkeypatch) -> Path:
    cache = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.chdir(tmp_path)  # no directory here is named like the ids below
    return cache


def test_a_cached_hub_id_loads_with_no_network(hub_cache, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    snap = cache_model(hub_cache, "acme/tiny-coder")
    assert resolve_model_path("acme/tiny-coder") == snap
    assert resolve_model_path(f"acme/tiny-coder@{COMMIT}") == snap  # pinned to a commit
    lm = load_model("acme/tiny-coder")
    assert lm.path == snap and lm.model.config.num_hidden_layers == 1


def test_a_revision_picks_its_own_snapshot(hub_cache, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    main = cache_model(hub_cache, "acme/tiny-coder")
    other = cache_model(hub_cache, "acme/tiny-coder", commit="f" * 40, ref="v2")
    assert resolve_model_path("acme/tiny-coder") == main
    assert resolve_model_path("acme/tiny-coder@v2") == other


def test_an_uncached_id_offline_says_how_to_get_it(hub_cache, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ConfigError) as e:
        load_model("acme/absent@v1")
    msg = str(e.value)
    assert "\n" not in msg and "HF_HUB_OFFLINE" in msg
    assert "`hf download acme/absent --revision v1`" in msg and "model init" not in msg


def test_an_uncached_id_the_hub_cannot_serve_is_one_line(hub_cache, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    # a hub that refuses every connection at once (port 9, discard): no network is touched
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    with pytest.raises(ConfigError) as e:
        resolve_model_path("acme/absent")
    msg = str(e.value)
    assert "\n" not in msg and "could not be downloaded" in msg and "hf download acme/absent" in msg


def test_a_local_directory_wins_over_a_hub_id(hub_cache):
    local = Path("acme/tiny-coder")
    local.mkdir(parents=True)
    cache_model(hub_cache, "acme/tiny-coder")
    assert not is_hub_id("acme/tiny-coder")
    assert resolve_model_path("acme/tiny-coder") == local
    assert resolve_model_path("~/x") == Path("~/x").expanduser()  # not an id: as it is


def test_train_model_path_takes_a_hub_id(hub_cache, monkeypatch, tmp_path):
    from looprl.config import load_config
    from looprl.train.config import TrainConfig
    from looprl.train.start import ModelStart, resolve_start

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    snap = cache_model(hub_cache, "acme/tiny-coder")
    cfg = load_config(TrainConfig, None, ["model.path=acme/tiny-coder"])
    assert resolve_start(cfg, tmp_path / "runs") == ModelStart("path", snap)
