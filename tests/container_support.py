"""Container images for the container backend's tests, built locally from a busybox root
filesystem with ``<engine> import`` (nothing is pulled), and why they cannot be where no engine
runs them. Shared by tests/sandbox/test_container.py and tests/tasks/test_harbor_image.py.

    python -m tests.container_support      # builds both images (for the documented commands)
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from looprl.errors import SandboxUnavailableError

BUSYBOX_IMAGE = "localhost/looprl-test:busybox"
HARBOR_IMAGE = "localhost/looprl-test:harbor-line-stats"
"""The image of tests/tasks/harbor_image_tasks/image-line-stats (its ``docker_image``)."""
NOTES = "the quick brown fox\n\njumps over\nthe lazy dog, twice over\n"
"""/app/notes.txt in ``HARBOR_IMAGE``."""
SWEBENCH_IMAGE = "localhost/looprl-test:swebench-shcalc"
"""A SWE-bench v5 row's image: the repo at /testbed (``SWEBENCH_FILES``), no Python."""
BUGGY_CALC = """#!/bin/sh
# calc.sh OP A B: min or max of two integers
case "$1" in
  min) if [ "$2" -lt "$3" ]; then echo "$2"; else echo "$3"; fi ;;
  max) if [ "$2" -lt "$3" ]; then echo "$2"; else echo "$3"; fi ;;
esac
"""
SWEBENCH_FILES = {"/testbed/calc.sh": BUGGY_CALC, "/testbed/README": "min and max in sh\n",
                  # SWE-bench's harness runs `bash eval.sh`: here bash is busybox's sh
                  "/bin/bash": '#!/bin/sh\nexec /bin/sh "$@"\n'}
_APPLETS = ("sh ls ln cat echo mkdir rm sleep grep test wc tr head tail id ps touch printf "
            "true false patch diff awk sort uniq cut sed cp mv chmod env cmp dirname basename "
            "find xargs expr").split()


def build_image(tag: str, files: dict[str, str] | None = None, workdir: str = "") -> str | None:
    """Import a busybox root filesystem (plus ``files``: absolute path -> text, those in /bin
    executable; a world-writable /var/state) as ``tag`` with each engine here, its WORKDIR
    ``workdir``; why not, or None."""
    from looprl.sandbox.container import _engines

    busybox = shutil.which("busybox")
    if busybox is None:
        return "no busybox on this host to build a test image from (apt-get install busybox-static)"
    if not _engines():
        return "no container engine installed (docker or podman)"
    with tempfile.TemporaryDirectory() as d:
        root = Path(d) / "rootfs"
        for sub in ("bin", "tmp", "var/state"):
            (root / sub).mkdir(parents=True)
        (root / "var/state").chmod(0o1777)
        shutil.copy(busybox, root / "bin" / "busybox")
        for a in _APPLETS:
            (root / "bin" / a).symlink_to("busybox")
        for path, text in (files or {}).items():
            p = root / path.lstrip("/")
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(text)
            if path.startswith("/bin/"):
                p.chmod(0o755)
        tar = subprocess.run(["tar", "-C", str(root), "-c", "."], capture_output=True,
                             check=True).stdout
        change = ["--change", f"WORKDIR {workdir}"] if workdir else []
        for engine in _engines():
            subprocess.run([*engine, "import", *change, "-", tag], input=tar,
                           capture_output=True, timeout=120)
    return None


def engine_for(tag: str, files: dict[str, str] | None = None, workdir: str = "") -> tuple[str, ...]:
    """The engine that runs ``tag`` (built first); skips the test with the reason otherwise."""
    from looprl.sandbox.container import check_engine

    why = build_image(tag, files, workdir)
    if why:
        pytest.skip(why)
    try:
        return check_engine(tag)
    except SandboxUnavailableError as e:
        pytest.skip(str(e))


def build_all() -> None:
    for tag, files, workdir in ((BUSYBOX_IMAGE, None, ""),
                                (HARBOR_IMAGE, {"/app/notes.txt": NOTES}, "/app"),
                                (SWEBENCH_IMAGE, SWEBENCH_FILES, "/testbed")):
        why = build_image(tag, files, workdir)
        print(f"{tag}: {why or 'built'}")


if __name__ == "__main__":
    build_all()
