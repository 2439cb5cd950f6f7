"""Hugging Face hub ids wherever a model path is accepted: ``org/name`` or ``org/name@revision``.

    path = resolve_model_path("Qwen/Qwen2.5-0.5B-Instruct")        # a snapshot in the hub cache
    path = resolve_model_path("Qwen/Qwen2.5-0.5B-Instruct@a1b2c3")  # pinned to a revision
    path = resolve_model_path("runs/x/model_rl")                    # a local directory, as it is

A string that names an existing local path is that path. Anything else shaped like a hub id is
looked up in the local hub cache first (``HF_HUB_CACHE``, else huggingface_hub's default under
``HF_HOME``), so a model downloaded once loads with no network. When it is not cached and the hub
may be used (``HF_HUB_OFFLINE`` unset), its weights, config and tokenizer are downloaded into the
cache (resumable: huggingface_hub keeps partial files); when that is not possible, the error says
how to get the model onto this machine. This module is the one place that turns a hub id into a
directory (``looprl.models.loading.load_model`` and ``looprl train``'s ``model.path`` call it).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from looprl.errors import ConfigError

HUB_ID = re.compile(r"(?P<repo>[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*)(?:@(?P<revision>[\w./-]+))?")
"""``org/name`` with an optional ``@revision`` (a branch, tag or commit)."""

DOWNLOAD_PATTERNS = ["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja", "*.tiktoken"]
"""What a download fetches: config, safetensors weights, tokenizer files and chat templates (no
pickled ``.bin`` weights: models load from safetensors only)."""


def is_hub_id(path: str | Path) -> bool:
    """Whether ``path`` is meant as a hub id: shaped like one and not an existing local path.

    >>> is_hub_id("Qwen/Qwen2.5-0.5B-Instruct"), is_hub_id("./runs/x"), is_hub_id("/abs/dir")
    (True, False, False)
    """
    s = str(path)
    return HUB_ID.fullmatch(s) is not None and not Path(s).expanduser().exists()


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def _how_to_get(hub_id: str) -> str:
    repo = HUB_ID.fullmatch(hub_id)
    rev = repo and repo.group("revision")
    name = repo.group("repo") if repo else hub_id
    fetch = f"hf download {name}" + (f" --revision {rev}" if rev else "")
    return (f"on a machine with internet run `{fetch}` (into HF_HUB_CACHE, or copy the cache "
            f"here), or pass a local checkpoint directory (there is none at ./{hub_id})")


def resolve_model_path(path: str | Path) -> Path:
    """The local directory ``path`` names: itself, or a hub id's snapshot (module docstring);
    ``ConfigError`` in one line when a hub id is neither cached nor downloadable."""
    if not is_hub_id(path):
        return Path(path).expanduser()
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    m = HUB_ID.fullmatch(str(path))
    assert m is not None, "is_hub_id matched it"
    repo, revision = m.group("repo"), m.group("revision")
    cache = os.environ.get("HF_HUB_CACHE") or None  # read now: huggingface_hub read it at import
    try:
        return Path(snapshot_download(repo, revision=revision, cache_dir=cache,
                                      local_files_only=True))
    except (LocalEntryNotFoundError, HFValidationError):
        pass
    if _offline():
        raise ConfigError(f"model {path!r} is not in the Hugging Face cache "
                          f"({cache or 'the default HF_HUB_CACHE'}) and HF_HUB_OFFLINE is set; "
                          + _how_to_get(str(path))) from None
    try:
        return Path(snapshot_download(repo, revision=revision, cache_dir=cache,
                                      allow_patterns=DOWNLOAD_PATTERNS))
    except Exception as e:  # no network, no such repo, gated, a proxy: the user's to fix
        first = str(e).strip().splitlines()[0][:160] if str(e).strip() else ""
        raise ConfigError(f"model {path!r} is not in the Hugging Face cache and could not be "
                          f"downloaded ({type(e).__name__}: {first}); "
                          + _how_to_get(str(path))) from None
