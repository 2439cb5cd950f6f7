"""Optional next-token pretraining of a local model on Python source (the pinned source corpus).

    from looprl.models.pretrain import pretrain
    result = pretrain("~/.cache/looprl/models/default", steps=300)
    result.final_loss, result.loss_png            # the model dir is updated in place

Text: a deterministic sample of the source corpus's ``.py`` files (``models.corpus``: pinned sdists
from PyPI, so the same on any machine) plus synthetic agent conversations in
the harness's chat format, tokenized, joined with the end-of-text token and cut into random
windows. A rich progress bar shows the loss; the curve is saved as ``pretrain_loss.png``.

With ``mtp_heads=k`` (or when the model dir already has MTP heads) the heads are trained in the
same steps by self-distillation on the forward's own hidden states and logits
(``looprl.models.mtp``) and saved beside the weights.
"""

from __future__ import annotations

import json
import math
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from rich.progress import BarColumn, TextColumn, TimeRemainingColumn

from looprl.errors import ConfigError
from looprl.models.loading import load_model, save_model
from looprl.models.mtp import (
    DISTILL_POSITIONS,
    attach_heads,
    capture_hidden,
    clip_grad_norms,
    distill_loss,
    heads_of,
    new_heads,
)
from looprl.models.tiny import chat_examples, python_sources
from looprl.progress import Bar


@dataclass(frozen=True)
class PretrainResult:
    """What a pretraining run did; ``losses_S`` has one entry per step."""

    model_dir: Path
    losses_S: tuple[float, ...]
    val_loss: float
    tokens_seen: int
    wall_s: float
    loss_png: Path
    mtp_accept_K: tuple[float, ...] = ()
    """Per MTP head, the acceptance estimate (1 - TV to the model) over the last 10 steps; empty
    without heads."""

    @property
    def final_loss(self) -> float:
        tail = self.losses_S[-10:]
        return sum(tail) / len(tail)


def corpus_tokens(tokenizer, max_chars: int, seed: int, transcripts: Sequence[Sequence[int]] = (),
                  exclude: Sequence[str] = ()) -> torch.Tensor:
    """One long 1-D tensor of token ids: source files (of the source corpus minus ``exclude``),
    chat examples and ``transcripts`` (token ids as they are, e.g. harness trajectories)
    separated by EOS, the documents shuffled."""
    sep = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    texts = [*python_sources(max_chars=max_chars, seed=seed, exclude=exclude),
             *chat_examples(seed=seed + 1)]
    docs = [tokenizer.encode(text) for text in texts]
    docs += [list(t) for t in transcripts]
    random.Random(seed).shuffle(docs)
    ids: list[int] = []
    for d in docs:
        ids += d + [sep]
    return torch.tensor(ids, dtype=torch.long)


def _batches(data_N: torch.Tensor, batch: int, seq_len: int, gen: torch.Generator) -> torch.Tensor:
    starts = torch.randint(0, len(data_N) - seq_len - 1, (batch,), generator=gen)
    return torch.stack([data_N[s:s + seq_len + 1] for s in starts.tolist()])


def warmup_cosine_lr(step: int, steps: int, lr: float, warmup: int) -> float:
    """The learning rate at ``step`` of ``steps``: linear warmup to ``lr`` over ``warmup`` steps,
    then a cosine decay to 0 at the last step."""
    if step < warmup:
        return lr * (step + 1) / warmup
    return lr * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup)))


def save_loss_png(losses: list[float], path: Path, title: str = "pretraining",
                  ylabel: str = "next-token loss") -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(range(1, len(losses) + 1), losses)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def pretrain(model_dir: str | Path, *, steps: int = 300, batch: int = 8, seq_len: int = 512,
             lr: float = 3e-3, corpus_chars: int = 4_000_000, bf16: bool = False, seed: int = 0,
             out_dir: str | Path | None = None, show_progress: bool = True,
             num_threads: int | None = None,
             transcripts: Sequence[Sequence[int]] = (), mtp_heads: int = 0,
             exclude: Sequence[str] = ()) -> PretrainResult:
    """Train ``steps`` AdamW steps of next-token prediction; save to ``out_dir`` (default: in place).

    ``num_threads`` sets torch's intra-op threads for the run (restored after): on a shared 2-core
    machine, 1 thread is often faster than 2 for small models. ``transcripts`` (token ids of
    harness trajectories, tool output included) join the corpus: next-token prediction over
    whole agent transcripts teaches the copying the agent needs (a name from the prompt into a
    grep, a path and line from grep into a read, a line from a read into an edit) with a loss on
    every token, not only the ~10% the model samples. ``mtp_heads``: k MTP heads to add and
    train alongside (0: none added; heads the model dir has are trained either way). ``exclude``:
    packages of the source corpus left out of the text (task packages).
    """
    previous = torch.get_num_threads()
    if num_threads is not None:
        torch.set_num_threads(num_threads)
    try:
        return _pretrain(model_dir, steps, batch, seq_len, lr, corpus_chars, bf16, seed, out_dir,
                         show_progress, transcripts, mtp_heads, exclude)
    finally:
        torch.set_num_threads(previous)


def _pretrain(model_dir, steps, batch, seq_len, lr, corpus_chars, bf16, seed, out_dir,
              show_progress, transcripts, mtp_heads, exclude) -> PretrainResult:
    if steps < 1 or batch < 1 or seq_len < 8:
        raise ConfigError("pretrain needs steps >= 1, batch >= 1 and seq_len >= 8")
    lm = load_model(model_dir, dtype="float32")
    model, tok = lm.model, lm.tokenizer
    heads = heads_of(model)
    if heads is None and mtp_heads:
        heads = attach_heads(model, new_heads(model, mtp_heads))
    out = Path(out_dir).expanduser() if out_dir else lm.path
    data = corpus_tokens(tok, corpus_chars, seed, transcripts, exclude)
    n_val = max(seq_len * 4, len(data) // 20)
    if len(data) - n_val < seq_len * 2:
        raise ConfigError(f"corpus too small ({len(data)} tokens) for seq_len {seq_len}; raise corpus_chars")
    train, val = data[:-n_val], data[-n_val:]
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1)
    model.train()
    losses: list[float] = []
    accepts: list[tuple[float, ...]] = []
    t0 = time.perf_counter()
    with Bar(TextColumn("pretrain"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
             TextColumn("loss {task.fields[loss]:.3f}"), TimeRemainingColumn(),
             disable=not show_progress) as bar:
        task = bar.add_task("pretrain", total=steps, loss=float("nan"))
        for step in range(steps):
            xy = _batches(train, batch, seq_len, gen)
            for g in opt.param_groups:
                g["lr"] = warmup_cosine_lr(step, steps, lr, warmup=max(1, steps // 20))
            x = xy[:, :-1]
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16), capture_hidden(model) as seen:
                fwd = model(input_ids=x, labels=x.clone())
            total = fwd.loss
            if heads is not None:  # self-distillation: the heads match this forward's distributions
                mtp = distill_loss(heads, model, seen[-1], x, max_positions=DISTILL_POSITIONS)
                total = total + mtp.loss
                accepts.append(mtp.accept_K)
            loss = fwd.loss
            opt.zero_grad(set_to_none=True)
            total.backward()
            clip_grad_norms(model, 1.0)
            opt.step()
            losses.append(loss.item())
            bar.update(task, advance=1, loss=losses[-1])
    model.eval()
    with torch.no_grad():
        vb = _batches(val, batch, seq_len, torch.Generator().manual_seed(seed + 1))
        val_loss = model(input_ids=vb, labels=vb.clone()).loss.item()
    out.mkdir(parents=True, exist_ok=True)
    save_model(model, tok, out)
    png = save_loss_png(losses, out / "pretrain_loss.png")
    tail = accepts[-10:]
    accept_K = tuple(sum(a[j] for a in tail) / len(tail) for j in range(len(tail[0]))) if tail else ()
    result = PretrainResult(out, tuple(losses), val_loss, steps * batch * seq_len,
                            time.perf_counter() - t0, png, accept_K)
    (out / "pretrain.json").write_text(json.dumps(
        {"steps": steps, "batch": batch, "seq_len": seq_len, "lr": lr, "final_loss": result.final_loss,
         "val_loss": val_loss, "tokens_seen": result.tokens_seen, "wall_s": result.wall_s,
         "mtp_accept": list(accept_K)}, indent=2))
    return result
