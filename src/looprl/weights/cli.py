"""``looprl weights``: inspect and verify a weight store.

    looprl weights ls [URL]        # versions, kind (full/delta), parent, stored size vs raw
    looprl weights verify [URL]    # rebuild every version and check every tensor's sha256
"""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from looprl.errors import WeightStoreError
from looprl.weights.store import FsspecWeightStore, LocalWeightStore

app = typer.Typer(help="Inspect and verify versioned policy weights.", no_args_is_help=True)
console = Console()
StoreUrl = Annotated[str | None, typer.Argument(help="Store URL (default LOOPRL_HOME/weights).")]


def _open(url: str | None) -> FsspecWeightStore:
    return FsspecWeightStore(url) if url else LocalWeightStore()


@app.command("ls")
def ls(url: StoreUrl = None) -> None:
    """List published versions."""
    store = _open(url)
    table = Table("version", "kind", "parent", "stored MB", "raw MB", "fraction")
    for v in store.versions():
        m = store.manifest(v)
        table.add_row(str(v), m["kind"], str(m["parent"]), f"{m['blob_bytes'] / 1e6:.2f}",
                      f"{m['raw_bytes'] / 1e6:.2f}", f"{m['blob_bytes'] / max(m['raw_bytes'], 1):.3f}")
    console.print(table)


@app.command("verify")
def verify(url: StoreUrl = None) -> None:
    """Rebuild every version from its chain and check checksums; exit 1 if any is unreadable."""
    store, bad = _open(url), 0
    for v in store.versions():
        try:
            store.fetch(v)
            console.print(f"v{v}: ok")
        except WeightStoreError as e:
            bad += 1
            console.print(f"[red]v{v}: {e}[/red]")
    if bad:
        console.print(f"{bad} unreadable version(s); readers fall back to the last full snapshot")
        raise typer.Exit(1)
