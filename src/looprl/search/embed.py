"""The code-embedding model: a small bi-encoder looprl trains itself, and loading of any other.

Training (``looprl embed train``): pairs mined from the installed packages (``pairs.py``) ->
a BPE tokenizer trained on them -> a BERT-style encoder (a few layers, mean pooling, L2-normalised)
trained with symmetric InfoNCE over in-batch negatives. Saved in Hugging Face format
(``model.safetensors`` + ``config.json`` + tokenizer files) plus ``looprl_embed.json`` (pooling,
text normalisation, lengths, training summary) and ``loss.png``.

    path = train(EmbedTrainConfig())          # ~9 min: 480 s of optimisation + mining/tokenizing
    emb = load_embedder(path)                # ours, or any sentence-transformers / HF encoder dir
    q_N_D = emb.embed_queries(["parse a header line"]); c_N_D = emb.embed_code([src])

Both sides go through ``normalize_text`` (identifiers split into words, lower-cased, whitespace
collapsed), so "parse header" and ``parseHeader`` share tokens.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import re
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
import torch
import torch.nn.functional as F
from tokenizers import Tokenizer, models, pre_tokenizers, trainers
from transformers import BertConfig, BertModel, PreTrainedTokenizerFast

from looprl import paths
from looprl.errors import ConfigError
from looprl.models.loading import hf_progress_bars  # noqa: F401 — HF's bars off unless asked
from looprl.search.pairs import HELDOUT_PACKAGES, Pair, mine_pairs, site_packages_dir

META_FILE = "looprl_embed.json"
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]"]


MODEL_VERSION = "v5"
"""Bumped whenever ``EmbedTrainConfig``'s defaults change: the default model lives in a versioned
directory, so a machine holding an older model is told to train the new one instead of using it."""


def default_model_dir() -> Path:
    return paths.sub("models") / f"code-embed-{MODEL_VERSION}"


def normalize_text(text: str) -> str:
    """Split identifiers into words, lower-case, collapse whitespace (indentation carries little).

    >>> normalize_text("def parseHTTPHeader(raw_line):\\n    return x")
    'def parse http header(raw line): return x'
    """
    s = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", text)
    s = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1 \2", s)
    s = s.replace("_", " ")
    return " ".join(s.lower().split())


class Embedder(Protocol):
    """Maps queries and code to L2-normalised float32 vectors of size ``dim``."""

    model_id: str
    """Identity of the weights: part of every index key, so a new model never reuses old vectors."""
    dim: int

    def embed_queries(self, texts: list[str]) -> np.ndarray: ...

    def embed_code(self, texts: list[str]) -> np.ndarray: ...


@dataclass(frozen=True)
class EmbedTrainConfig:
    """How to train the code-embedding model."""

    out: str = ""
    """Output directory; empty means ``$LOOPRL_HOME/models/code-embed``."""
    max_pairs: int = 60_000
    """Pairs mined from site-packages (held-out benchmark packages excluded)."""
    vocab_size: int = 8192
    """BPE vocabulary trained on the pairs."""
    hidden: int = 256
    """Encoder width (= vector size)."""
    layers: int = 0
    """Transformer layers. 0 = mean of contextless subword embeddings (a neural bag of words, as
    in CodeSearchNet's NBoW baseline): on this shared 2-core machine a step takes 0.15 s vs ~1 s
    for one 64-wide layer and 5-8 s for two 128-wide ones, so only 0 layers sees the data several
    times in a few minutes. Use 2-4 layers when there is compute to spare."""
    heads: int = 4
    """Attention heads."""
    max_query_tokens: int = 32
    """Queries are one sentence; longer is truncated."""
    max_code_tokens: int = 128
    """Code is truncated here: the signature and first lines carry most of the meaning."""
    batch_size: int = 256
    """Pairs per step; every other pair of the batch is a negative."""
    lr: float = 3e-3
    """Peak AdamW learning rate (warmup, then linear decay over the run)."""
    steps: int = 2000
    """Upper bound on optimizer steps (the time budget usually ends the run first)."""
    time_budget_s: float = 480.0
    """Wall-clock budget for the optimisation; the LR schedule follows elapsed time or steps. On
    the tune packages (networkx, pygments) the 480 s model beats 330 s runs with batch 512 or
    temperature 0.03 (dense recall@10 0.507 vs 0.450 / 0.463): more steps matter most here."""
    package_batches: float = 0.5
    """Fraction of batches drawn from a single package: their negatives share the vocabulary of
    the positive (harder negatives, closer to searching inside one repository)."""
    temperature: float = 0.05
    """InfoNCE temperature."""
    threads: int = 1
    """torch threads: on a shared 2-core machine 1 thread is faster than 2 (see FACTS.md)."""
    seed: int = 0
    """Seed for sampling, initialisation and batching."""
    progress: bool = True
    """Show a rich progress bar."""


@dataclass(frozen=True)
class TrainResult:
    """Where the model went and how training went."""

    path: str
    steps: int
    pairs: int
    final_loss: float
    val_acc1: float
    """Top-1 accuracy of query->code among 512 held-back pairs of the training packages."""
    seconds: float


# --- tokenizer ---------------------------------------------------------------------------------

def train_tokenizer(texts: list[str], vocab_size: int) -> Tokenizer:
    """A BPE over normalised text, split on whitespace and punctuation first."""
    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS, min_frequency=2,
                                  show_progress=False)
    tok.train_from_iterator((normalize_text(t) for t in texts), trainer=trainer)
    return tok


CHARS_PER_TOKEN_CUT = 5
"""Normalised text is cut (at a space) to ``max_len * 5`` chars before tokenizing: code averages
~3.4 chars a token (95th percentile 4.8), so the cut text almost always still fills ``max_len``
tokens, at about half the tokenizing cost. Texts that come up short are re-encoded whole."""


def _encode(tok: Tokenizer, texts: list[str], max_len: int) -> list[list[int]]:
    """Token ids of the normalised texts, first ``max_len`` of each (``[UNK]`` if empty).

    Same ids as encoding each whole text: the tokenizer pre-splits on whitespace, so a text cut at
    a space yields a prefix of the whole text's tokens; enough of them is the same truncation."""
    tok.no_padding()
    tok.enable_truncation(max_len)
    encode = getattr(tok, "encode_batch_fast", tok.encode_batch)  # _fast: no offsets, ~2x less CPU
    norm = [normalize_text(t) for t in texts]
    budget = max_len * CHARS_PER_TOKEN_CUT
    heads = [t if len(t) <= budget or (k := t.rfind(" ", 0, budget + 1)) <= 0 else t[:k]
             for t in norm]
    ids = [e.ids for e in encode(heads)]
    redo = [i for i, x in enumerate(ids) if len(x) < max_len and len(heads[i]) < len(norm[i])]
    if redo:
        for i, e in zip(redo, encode([norm[i] for i in redo]), strict=True):
            ids[i] = e.ids
    return [x or [1] for x in ids]


def _pad(ids: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    T = max(len(x) for x in ids)
    ids_B_T = np.zeros((len(ids), T), dtype=np.int64)
    for i, x in enumerate(ids):
        ids_B_T[i, :len(x)] = x
    lens_B = np.fromiter((len(x) for x in ids), dtype=np.int64, count=len(ids))
    mask_B_T = (np.arange(T)[None, :] < lens_B[:, None]).astype(np.int64)
    return torch.from_numpy(ids_B_T), torch.from_numpy(mask_B_T)


def mean_pool(hidden_B_T_D: torch.Tensor, mask_B_T: torch.Tensor) -> torch.Tensor:
    """Masked mean over tokens, L2-normalised."""
    m = mask_B_T.unsqueeze(-1).to(hidden_B_T_D.dtype)
    v_B_D = (hidden_B_T_D * m).sum(1) / m.sum(1).clamp(min=1.0)
    return F.normalize(v_B_D, dim=-1)


# --- our model ---------------------------------------------------------------------------------

class BagOfTokens:
    """The exact forward of a 0-layer encoder (a neural bag of words), in numpy.

    For token id v at position p, x = word[v] + pos[p] (+ the constant token-type row) and the
    model outputs LayerNorm(x); a text's vector is the mean over its tokens, L2-normalised. With
    no attention this expands to, per text,

        sum_t y_t = gamma * (sum_t r_t word[v_t] + sum_t r_t pos[p_t] - sum_t r_t mu_t) + L beta

    where mu_t and r_t = 1/std_t come from per-row tables (row sums, squared norms and the
    word.pos^T dot products, computed once in float64), so no (tokens, D) activation is
    normalised: texts of equal length are stacked and the only heavy step is one gather and one
    batched (1 x L) @ (L x D) product. Same vectors as ``BertModel`` + ``mean_pool`` to ~1e-6,
    ~10x faster, and no torch thread pool (which on a shared 2-core machine turns a 1 ms query
    into ~90 ms).
    """

    TOKENS_PER_BLOCK = 1 << 15  # 32 MB of gathered fp32 rows at D=256

    def __init__(self, model: BertModel) -> None:
        assert model.config.num_hidden_layers == 0, "BagOfTokens is only exact for 0 layers"
        e = model.embeddings
        with torch.no_grad():
            self.word_V_D = e.word_embeddings.weight.numpy().copy()
            self.pos_P_D = (e.position_embeddings.weight + e.token_type_embeddings.weight[0]).numpy()
            self.gamma_D = e.LayerNorm.weight.numpy().copy()
            self.beta_D = e.LayerNorm.bias.numpy().copy()
        self.eps = float(e.LayerNorm.eps)
        w64, p64 = self.word_V_D.astype(np.float64), self.pos_P_D.astype(np.float64)
        self.dim = w64.shape[1]
        self.wsum_V, self.psum_P = w64.sum(1), p64.sum(1)
        self.wsq_V, self.psq_P = np.square(w64).sum(1), np.square(p64).sum(1)
        self.wp_V_P = w64 @ p64.T

    def __call__(self, ids: list[list[int]]) -> np.ndarray:
        out_N_D = np.zeros((len(ids), self.dim), dtype=np.float32)
        lens_N = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
        assert len(ids) == 0 or lens_N.min() > 0, "every text needs at least one token"
        for L in np.unique(lens_N).tolist():
            rows = np.flatnonzero(lens_N == L)
            step = max(1, self.TOKENS_PER_BLOCK // L)
            for s in range(0, len(rows), step):
                part = rows[s:s + step]
                tok_B_L = np.array([ids[i] for i in part], dtype=np.int64).reshape(len(part), L)
                out_N_D[part] = self._same_length(tok_B_L)
        return out_N_D

    def _same_length(self, tok_B_L: np.ndarray) -> np.ndarray:
        L, D = tok_B_L.shape[1], self.dim
        pos_L = np.arange(L)
        mu_B_L = (self.wsum_V[tok_B_L] + self.psum_P[pos_L]) / D
        sq_B_L = (self.wsq_V[tok_B_L] + 2 * self.wp_V_P[tok_B_L, pos_L] + self.psq_P[pos_L]) / D
        r_B_L = 1.0 / np.sqrt(np.maximum(sq_B_L - mu_B_L ** 2, 0.0) + self.eps)
        r32_B_1_L = r_B_L.astype(np.float32)[:, None, :]
        s_B_D = (r32_B_1_L @ self.word_V_D[tok_B_L])[:, 0]          # sum_t r_t word[v_t]
        s_B_D += r_B_L.astype(np.float32) @ self.pos_P_D[:L]          # sum_t r_t pos[t]
        s_B_D -= (r_B_L * mu_B_L).sum(1, keepdims=True).astype(np.float32)
        v_B_D = self.gamma_D * s_B_D / L + self.beta_D
        return v_B_D / np.maximum(np.linalg.norm(v_B_D, axis=1, keepdims=True), 1e-12)


class CodeEmbedder:
    """The looprl-trained bi-encoder (one shared encoder for queries and code)."""

    def __init__(self, model: BertModel, tok: Tokenizer, meta: dict, model_id: str) -> None:
        self.model = model.eval()
        self.tok = tok
        self.meta = meta
        self.model_id = model_id
        self.dim = int(model.config.hidden_size)
        self.batch_size = 256
        self.bag = BagOfTokens(model) if model.config.num_hidden_layers == 0 else None

    def token_ids(self, texts: list[str], max_len: int) -> list[list[int]]:
        """What the encoder sees: normalised texts as token ids, at most ``max_len`` each."""
        # cut long chunks before normalising: only the first max_len tokens are kept anyway
        return _encode(self.tok, [t[:max_len * 8] for t in texts], max_len)

    def _embed(self, texts: list[str], max_len: int) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        ids = self.token_ids(texts, max_len)
        return self.bag(ids) if self.bag is not None else self.forward(ids)

    def forward(self, ids: list[list[int]]) -> np.ndarray:
        """Vectors through the full model on padded, length-sorted batches (any layer count)."""
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))  # less padding per batch
        out_N_D = np.zeros((len(ids), self.dim), dtype=np.float32)
        with torch.inference_mode():
            for s in range(0, len(order), self.batch_size):
                idx = order[s:s + self.batch_size]
                ids_B_T, mask_B_T = _pad([ids[i] for i in idx])
                h = self.model(input_ids=ids_B_T, attention_mask=mask_B_T).last_hidden_state
                out_N_D[idx] = mean_pool(h, mask_B_T).numpy()
        return out_N_D

    def embed_queries(self, texts: list[str]) -> np.ndarray:
        return self._embed(texts, int(self.meta["max_query_tokens"]))

    def embed_code(self, texts: list[str]) -> np.ndarray:
        return self._embed(texts, int(self.meta["max_code_tokens"]))


class HFEmbedder:
    """Any encoder saved locally: sentence-transformers if importable, else mean-pooled transformers."""

    def __init__(self, path: Path, max_len: int = 256) -> None:
        self.model_id = f"hf:{path.resolve()}:{_dir_digest(path)}"
        self.max_len = max_len
        try:
            from sentence_transformers import SentenceTransformer
            self.st = SentenceTransformer(str(path), device="cpu")
            self.dim = int(self.st.get_sentence_embedding_dimension())
        except ImportError:
            from transformers import AutoModel, AutoTokenizer
            self.st = None
            self.tok = AutoTokenizer.from_pretrained(str(path))
            self.model = AutoModel.from_pretrained(str(path)).eval()
            self.dim = int(self.model.config.hidden_size)

    def _embed(self, texts: list[str]) -> np.ndarray:
        if self.st is not None:
            return np.asarray(self.st.encode(texts, normalize_embeddings=True), dtype=np.float32)
        out = []
        with torch.inference_mode():
            for s in range(0, len(texts), 32):
                b = self.tok(texts[s:s + 32], padding=True, truncation=True,
                             max_length=self.max_len, return_tensors="pt")
                h = self.model(**b).last_hidden_state
                out.append(mean_pool(h, b["attention_mask"]).numpy())
        return np.concatenate(out) if out else np.zeros((0, self.dim), np.float32)

    def embed_queries(self, texts: list[str]) -> np.ndarray:
        return self._embed(texts)

    def embed_code(self, texts: list[str]) -> np.ndarray:
        return self._embed(texts)


def _dir_digest(path: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(path.glob("*.safetensors")) + sorted(path.glob("*.bin")):
        h.update(f.name.encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def load_embedder(path: str | Path | None = None) -> Embedder:
    """Load our trained model, or any sentence-transformers / HF encoder from a local directory."""
    p = Path(path) if path else default_model_dir()
    if not p.is_dir():
        raise ConfigError(f"no embedding model at {p}: train one with `looprl embed train` "
                          f"(or pass a local sentence-transformers/HF model directory)")
    if not (p / META_FILE).exists():
        return HFEmbedder(p)
    meta = json.loads((p / META_FILE).read_text())
    model = BertModel.from_pretrained(str(p), add_pooling_layer=False)
    tok = Tokenizer.from_file(str(p / "tokenizer.json"))
    return CodeEmbedder(model, tok, meta, f"looprl:{_dir_digest(p)}")


# --- training ----------------------------------------------------------------------------------

def _cached_pairs(max_pairs: int, seed: int) -> list[Pair]:
    key = hashlib.sha256(f"{site_packages_dir()}|{max_pairs}|{seed}|{HELDOUT_PACKAGES}|v1"
                         .encode()).hexdigest()[:16]
    f = paths.sub("search") / f"pairs-{key}.jsonl"
    if f.exists():
        return [Pair(**json.loads(line)) for line in f.read_text().splitlines()]
    pairs = mine_pairs(site_packages_dir(), max_pairs=max_pairs, seed=seed)
    tmp = f.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(asdict(p)) + "\n" for p in pairs))
    tmp.replace(f)
    return pairs


def info_nce(q_B_D: torch.Tensor, c_B_D: torch.Tensor, temperature: float) -> torch.Tensor:
    """Symmetric InfoNCE: row i of each side must pick row i of the other among the batch."""
    logits_B_B = q_B_D @ c_B_D.T / temperature
    labels_B = torch.arange(len(q_B_D))
    return (F.cross_entropy(logits_B_B, labels_B) + F.cross_entropy(logits_B_B.T, labels_B)) / 2


def _embed_ids(model: BertModel, ids: list[list[int]]) -> torch.Tensor:
    ids_B_T, mask_B_T = _pad(ids)
    return mean_pool(model(input_ids=ids_B_T, attention_mask=mask_B_T).last_hidden_state, mask_B_T)


def _val_acc1(model: BertModel, q_ids: list[list[int]], c_ids: list[list[int]]) -> float:
    if not q_ids:
        return float("nan")
    model.eval()
    with torch.inference_mode():
        q, c = _embed_ids(model, q_ids), _embed_ids(model, c_ids)
        acc = float(((q @ c.T).argmax(1) == torch.arange(len(q))).float().mean())
    model.train()
    return acc


def _blocks(packages: list[str], bs: int, rng: random.Random,
            grouped: bool) -> Iterator[list[int]]:
    """Endless batches of pair indices; ``grouped`` batches come from one package at a time."""
    while True:
        idx = list(range(len(packages)))
        rng.shuffle(idx)
        if grouped:
            idx.sort(key=lambda i: packages[i])  # stable: still shuffled inside a package
        blocks = [idx[s:s + bs] for s in range(0, len(idx) - bs + 1, bs)]
        rng.shuffle(blocks)
        yield from blocks


def _lr_at(cfg: EmbedTrainConfig, progress: float) -> float:
    warm = 0.05
    if progress < warm:
        return cfg.lr * (progress / warm)
    return cfg.lr * max(0.05, 1.0 - (progress - warm) / (1 - warm))


def _plot(losses: list[float], out: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(losses, lw=0.6, alpha=0.5, label="loss")
    w = max(1, len(losses) // 20)
    smooth = np.convolve(losses, np.ones(w) / w, mode="valid") if len(losses) >= w else losses
    ax.plot(range(w - 1, w - 1 + len(smooth)), smooth, label=f"mean of {w}")
    ax.set_xlabel("step")
    ax.set_ylabel("InfoNCE loss")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)


def train(cfg: EmbedTrainConfig, pairs: list[Pair] | None = None) -> TrainResult:
    """Train the bi-encoder and save it; ``pairs`` overrides mining (tests pass a few)."""
    from rich.progress import BarColumn, TextColumn, TimeElapsedColumn

    from looprl.progress import Bar

    t0 = time.time()
    torch.manual_seed(cfg.seed)
    torch.set_num_threads(cfg.threads)
    pairs = pairs if pairs is not None else _cached_pairs(cfg.max_pairs, cfg.seed)
    if len(pairs) < 4:
        raise ConfigError(f"only {len(pairs)} training pairs: need at least 4 (check site-packages)")
    n_val = min(512, len(pairs) // 10)
    val, pairs = pairs[:n_val], pairs[n_val:]
    tok = train_tokenizer([p.query for p in pairs] + [p.code for p in pairs[:20_000]],
                          cfg.vocab_size)
    q_ids = _encode(tok, [p.query for p in pairs], cfg.max_query_tokens)
    c_ids = _encode(tok, [p.code for p in pairs], cfg.max_code_tokens)
    vq = _encode(tok, [p.query for p in val], cfg.max_query_tokens)
    vc = _encode(tok, [p.code for p in val], cfg.max_code_tokens)
    bcfg = BertConfig(vocab_size=tok.get_vocab_size(), hidden_size=cfg.hidden,
                      num_hidden_layers=cfg.layers, num_attention_heads=cfg.heads,
                      intermediate_size=cfg.hidden * 4, max_position_embeddings=max(
                          cfg.max_code_tokens, cfg.max_query_tokens) + 2,
                      type_vocab_size=1, pad_token_id=0, hidden_dropout_prob=0.0,
                      attention_probs_dropout_prob=0.0)
    model = BertModel(bcfg, add_pooling_layer=False).train()
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.01)
    rng = random.Random(cfg.seed)
    bs = min(cfg.batch_size, len(pairs))
    packages = [p.package for p in pairs]
    streams = (_blocks(packages, bs, random.Random(cfg.seed + 1), False),
               _blocks(packages, bs, random.Random(cfg.seed + 2), True))
    losses: list[float] = []
    start = time.time()
    with Bar(TextColumn("[bold]embed train"), BarColumn(), TextColumn("{task.description}"),
             TimeElapsedColumn(), disable=not cfg.progress) as bar:
        job = bar.add_task("", total=1.0)
        step = 0
        while step < cfg.steps:
            progress = max(step / cfg.steps, (time.time() - start) / cfg.time_budget_s)
            if progress >= 1.0:
                break
            for g in opt.param_groups:
                g["lr"] = _lr_at(cfg, progress)
            idx = next(streams[rng.random() < cfg.package_batches])
            loss = info_nce(_embed_ids(model, [q_ids[i] for i in idx]),
                            _embed_ids(model, [c_ids[i] for i in idx]), cfg.temperature)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            losses.append(float(loss.detach()))
            step += 1
            bar.update(job, completed=progress, description=f"step {step} loss {losses[-1]:.3f}")
    acc = _val_acc1(model, vq, vc)
    out = Path(cfg.out) if cfg.out else default_model_dir()
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out))
    tok.save(str(out / "tokenizer.json"))
    PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]",
                            cls_token="[CLS]", sep_token="[SEP]").save_pretrained(str(out))
    tail = losses[-max(1, len(losses) // 10):]
    result = TrainResult(str(out), step, len(pairs), float(np.mean(tail)) if tail else math.nan,
                         acc, time.time() - t0)
    meta = {"pooling": "mean", "normalize": True, "text_normalizer": "split_identifiers_v1",
            "max_query_tokens": cfg.max_query_tokens, "max_code_tokens": cfg.max_code_tokens,
            "heldout_packages": list(HELDOUT_PACKAGES), "config": asdict(cfg),
            "result": asdict(result)}
    (out / META_FILE).write_text(json.dumps(meta, indent=2) + "\n")
    _plot(losses or [math.nan], out / "loss.png")
    return result
