"""Container sandboxes' fork and snapshot against bubblewrap's, side by side in one run.

    python -m tests.container_support          # builds the image (busybox root fs, no pull)
    python benchmarks/container_fork.py [--image localhost/looprl-test:busybox] [--reps 7]

Over one small repository (200 files), with one file changed in the workspace and one in the
container's own root filesystem before each snapshot, p50s of:

- ``container_create_ms``: ``create_sandbox(image=)`` + its first command (the engine's
  ``run`` and ``exec``; what a rollout's cold lease costs);
- ``container_snapshot_ms``: ``ContainerSandbox.snapshot`` (``<engine> commit`` of the root
  filesystem + the workspace's frozen layer);
- ``container_fork_child_ms``: one child of ``fork`` (a container of the committed image over a
  fork of the layer) + its first command;
- ``container_reset_ms``: ``reset`` (the pool's idle reuse: a fresh container, the workspace
  reset);
- ``bwrap_fork_child_ms``: one child of ``BwrapSandbox.fork`` + its first command, the same way.

The last line is machine-readable: ``container_fork_child_ms=… bwrap_fork_child_ms=…
ratio_container_vs_bwrap=… container_snapshot_ms=… container_create_ms=… container_reset_ms=…``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from looprl.sandbox import create_sandbox
from looprl.types import Image


def _repo(root: Path) -> Path:
    repo = root / "repo"
    for i in range(200):
        p = repo / f"pkg{i % 10}" / f"m{i}.txt"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(f"line {i}\n" * 20)
    return repo


def _ms(t0: float) -> float:
    return 1000 * (time.perf_counter() - t0)


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--image", default="localhost/looprl-test:busybox")
    ap.add_argument("--reps", type=int, default=7)
    args = ap.parse_args()
    image = Image(args.image, "/app")
    got: dict[str, list[float]] = {k: [] for k in (
        "container_create_ms", "container_snapshot_ms", "container_fork_child_ms",
        "container_reset_ms", "bwrap_fork_child_ms")}
    with tempfile.TemporaryDirectory() as d:
        repo = _repo(Path(d))
        for _ in range(args.reps):
            t0 = time.perf_counter()
            sb = await create_sandbox(repo, image=image)
            await sb.exec("true")
            got["container_create_ms"].append(_ms(t0))
            try:
                await sb.exec("echo x > pkg0/m0.txt && echo y > /var/state/y")
                t0 = time.perf_counter()
                snap = await sb.snapshot()
                got["container_snapshot_ms"].append(_ms(t0))
                t0 = time.perf_counter()
                kid = await create_sandbox(repo, image=image, snapshot=snap)
                await kid.exec("cat /var/state/y")
                got["container_fork_child_ms"].append(_ms(t0))
                await kid.close()
                snap.release()
                t0 = time.perf_counter()
                await sb.reset()
                got["container_reset_ms"].append(_ms(t0))
            finally:
                await sb.close()
            bw = await create_sandbox(repo)
            try:
                await bw.exec("echo x > pkg0/m0.txt")
                snap = await bw.snapshot()
                t0 = time.perf_counter()
                kid = await create_sandbox(repo, snapshot=snap)
                await kid.exec("true")
                got["bwrap_fork_child_ms"].append(_ms(t0))
                await kid.close()
                snap.release()
            finally:
                await bw.close()
    p50 = {k: statistics.median(v) for k, v in got.items()}
    for k, v in p50.items():
        print(f"{k:28s} p50 {v:8.1f} ms  (of {len(got[k])}: {min(got[k]):.1f}-{max(got[k]):.1f})")
    ratio = p50["container_fork_child_ms"] / p50["bwrap_fork_child_ms"]
    print(f"container_fork_child_ms={p50['container_fork_child_ms']:.1f} "
          f"bwrap_fork_child_ms={p50['bwrap_fork_child_ms']:.1f} "
          f"ratio_container_vs_bwrap={ratio:.1f} "
          f"container_snapshot_ms={p50['container_snapshot_ms']:.1f} "
          f"container_create_ms={p50['container_create_ms']:.1f} "
          f"container_reset_ms={p50['container_reset_ms']:.1f}")


if __name__ == "__main__":
    asyncio.run(main())
