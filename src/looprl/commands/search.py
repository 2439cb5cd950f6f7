"""``looprl embed`` (train / evaluate the code-embedding model) and ``looprl search`` (index a
directory, query it).

    looprl embed train -o time_budget_s=300 -o layers=2        # dotted overrides of EmbedTrainConfig
    looprl embed eval --queries 400
    looprl search index ./repo                                 # incremental: re-run after edits
    looprl search query ./repo "where are headers parsed" -k 5 --glob 'src/**'

``embed_app`` is the ``embed`` sub-app, ``search_app`` the ``search`` one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from looprl.errors import ConfigError

embed_app = typer.Typer(help="The code-embedding model: train it, evaluate it.", no_args_is_help=True)
search_app = typer.Typer(help="Semantic code search over a directory.", no_args_is_help=True)


@embed_app.command()
def train(overrides: Annotated[list[str] | None, typer.Option(
        "-o", help="Dotted override of EmbedTrainConfig, e.g. -o time_budget_s=300.")] = None,
          config: Annotated[Path | None, typer.Option(help="TOML file of EmbedTrainConfig.")] = None,
          ) -> None:
    """Mine pairs from site-packages, train the bi-encoder, save it (HF format + loss.png)."""
    from looprl.config import load_config, save_config
    from looprl.search.embed import EmbedTrainConfig
    from looprl.search.embed import train as run_train

    cfg = load_config(EmbedTrainConfig, config, overrides or [])
    res = run_train(cfg)
    save_config(cfg, Path(res.path) / "train_config.json")
    typer.echo(f"saved {res.path}: {res.steps} steps over {res.pairs} pairs in {res.seconds:.0f} s, "
               f"final loss {res.final_loss:.3f}, held-back top-1 {res.val_acc1:.3f}")


@embed_app.command("eval")
def evaluate_cmd(model: Annotated[Path | None, typer.Option(help="Embedder dir.")] = None,
                 queries: Annotated[int, typer.Option(help="Number of queries.", min=1)] = 400,
                 fusion: Annotated[str, typer.Option(help="zscore | score | rrf | dense | bm25")] = "zscore",
                 ) -> None:
    """Recall@10 / MRR on held-out packages: fused vs dense vs BM25 vs grep."""
    from looprl.search.embed import load_embedder
    from looprl.search.evaluate import evaluate
    from looprl.search.index import SearchConfig

    cfg = SearchConfig(fusion=fusion)  # a bad --fusion fails before the model loads
    res = evaluate(load_embedder(model), n_queries=queries, cfg=cfg)
    typer.echo(f"{res.n_queries} queries over {res.n_chunks} chunks")
    typer.echo(f"recall@10  fused {res.recall10:.3f}  dense {res.recall10_dense:.3f}  "
               f"bm25 {res.recall10_bm25:.3f}  grep {res.recall10_grep:.3f}")
    typer.echo(f"mrr        fused {res.mrr:.3f}  bm25 {res.mrr_bm25:.3f}")


def _index_dir(root: Path) -> Path:
    from looprl import paths
    from looprl.search.index import file_hash

    return paths.sub("search") / f"dir-{file_hash(str(root.resolve()).encode())}"


def _open(root: Path, model: Path | None, quiet: bool = False):
    from looprl.search.embed import load_embedder
    from looprl.search.index import Store, read_tree

    if not root.is_dir():
        raise ConfigError(f"{root} is not a directory")
    emb = load_embedder(model)
    where = _index_dir(root)
    store = Store.load(where) if (where / "meta.json").exists() else None
    if store is None or store.model_id != emb.model_id:
        store = Store(emb.dim, emb.model_id)
    st = store.sync(read_tree(root), emb)
    if st.files_embedded or st.files_removed or not (where / "meta.json").exists():
        store.save(where)
    if not quiet:
        typer.echo(f"{root}: {len(store.files)} files, {len(store)} chunks; embedded "
                   f"{st.files_embedded} files ({st.chunks_embedded} chunks), removed "
                   f"{st.files_removed}; index at {where}", err=True)
    return store, emb


@search_app.command()
def index(root: Annotated[Path, typer.Argument(help="Directory to index.")],
          model: Annotated[Path | None, typer.Option(help="Embedder dir.")] = None) -> None:
    """Build or update the index of ROOT (only new or changed files are embedded)."""
    _open(root, model)


@search_app.command()
def query(root: Annotated[Path, typer.Argument(help="Indexed directory.")],
          text: Annotated[str, typer.Argument(help="What to look for.")],
          k: Annotated[int, typer.Option("-k", help="Results.", min=1)] = 10,
          glob: Annotated[str | None, typer.Option(help="Only paths matching this glob.")] = None,
          model: Annotated[Path | None, typer.Option(help="Embedder dir.")] = None) -> None:
    """Search ROOT (its index is brought up to date first)."""
    from looprl.search.index import CodeIndex

    store, emb = _open(root, model, quiet=True)
    for n, h in enumerate(CodeIndex(store, emb).search(text, k=k, path_glob=glob), 1):
        typer.echo(f"{n}. {h.path}:{h.start_line}-{h.end_line} {h.kind} {h.name}")
