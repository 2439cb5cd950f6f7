"""``looprl weights``: inspect and verify a weight store.

    looprl weights ls [URL]        # versions, kind (full/delta), parent, stored size vs raw
    looprl weights verify [URL]    # rebuild every version; check manifests, blobs and tensors
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.table import Table

from looprl.errors import WeightStoreError

if TYPE_CHECKING:
    from looprl.weights.store import FsspecWeightStore

app = typer.Typer(help="Inspect and verify versioned policy weights.", no_args_is_help=True)
console = Console()
StoreUrl = Annotated[str | None, typer.Argument(help="Store URL (default LOOPRL_HOME/weights).")]


def _open(url: str | None) -> FsspecWeightStore:
    """The store at ``url``; a reader must not create one where none is (a typo'd path)."""
    import fsspec

    if url:
        try:
            fs, root = fsspec.core.url_to_fs(url)
            exists = fs.isdir(root)
        except (ImportError, ValueError, OSError) as e:
            raise WeightStoreError(f"cannot open weight store {url!r}: {e}") from None
        if not exists:
            raise WeightStoreError(f"no weight store at {url!r}; give the directory or URL a "
                                   "trainer published to (e.g. runs/NAME/weights)")
    from looprl.weights.store import FsspecWeightStore, LocalWeightStore  # torch: after the checks

    return FsspecWeightStore(url) if url else LocalWeightStore()


@app.command("ls")
def ls(url: StoreUrl = None) -> None:
    """List published versions."""
    store = _open(url)
    table = Table("version", "kind", "parent", "stored MB", "raw MB", "fraction")
    for v in store.versions():
        try:
            m = store.manifest(v)
        except WeightStoreError as e:
            table.add_row(str(v), "[red]damaged[/red]", "", "", "", str(e).split(": ", 1)[-1])
            continue
        table.add_row(str(v), m["kind"], str(m["parent"]), f"{m['blob_bytes'] / 1e6:.2f}",
                      f"{m['raw_bytes'] / 1e6:.2f}", f"{m['blob_bytes'] / max(m['raw_bytes'], 1):.3f}")
    console.print(table)


@app.command("verify")
def verify(url: StoreUrl = None) -> None:
    """Rebuild every version from its chain and check every checksum (manifest, blob, tensors)
    and the manifest's consistency; exit 1 if any version is damaged."""
    store, bad = _open(url), 0
    for v in store.versions():
        try:
            store.fetch(v)
            console.print(f"v{v}: ok")
        except WeightStoreError as e:
            bad += 1
            console.print(f"[red]v{v}: {e}[/red]")
    if bad:
        console.print(f"{bad} damaged version(s); readers fall back to the last intact full snapshot")
        raise typer.Exit(1)
