"""The wheel: built from the source tree, installed into a fresh venv, it runs ``looprl --help`` and
carries its package data (configs, the dashboard's scripts and styles, the launcher's C source).

Kept fast and offline: the wheel is built without build isolation and installed with
``--no-deps``; the fresh venv sees this environment's site-packages (torch, transformers, ...)
through a ``.pth`` file of plain paths, which Python adds to ``sys.path`` without running the
``.pth`` files inside them, so this checkout's editable install of looprl stays invisible and
``import looprl`` can only find the wheel's copy.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow  # a wheel build and a venv: ~15-30 s

DATA = ("configs/quickstart.toml", "dashboard/static/uPlot.iife.min.js",
        "dashboard/static/uPlot.min.css", "dashboard/static/uPlot.LICENSE.txt",
        "dashboard/static/dashboard.js", "dashboard/static/style.css", "sandbox/launch.c")


def _run(cmd: list[str], **kw) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, **kw)
    assert r.returncode == 0, f"{' '.join(map(str, cmd))} failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r


def _setuptools_ok() -> bool:
    try:
        import setuptools
    except ImportError:
        return False
    return int(setuptools.__version__.split(".")[0]) >= 77  # pyproject's build requirement


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    src = tmp_path_factory.mktemp("src")  # a copy: building in the checkout would leave build/
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "src", src / "src",
                    ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "*.pyc"))
    out = tmp_path_factory.mktemp("dist")
    isolation = [] if _setuptools_ok() else ["--use-pep517"]  # else pip fetches setuptools
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out),
          *(["--no-build-isolation"] if not isolation else isolation), str(src)])
    (whl,) = out.glob("looprl-*.whl")
    return whl


def test_wheel_carries_package_data_and_extras(wheel: Path):
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        meta = z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
        entry = z.read(next(n for n in names if n.endswith(".dist-info/entry_points.txt"))).decode()
    for path in DATA:
        assert f"looprl/{path}" in names, f"the wheel lacks looprl/{path}"
    assert "looprl = looprl.cli:app" in entry
    assert "Provides-Extra: wandb" in meta and "Provides-Extra: test" in meta


def test_wheel_installs_into_a_fresh_venv(wheel: Path, tmp_path: Path):
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    py = venv / "bin" / "python"
    inner = Path(_run([str(py), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"]
                      ).stdout.strip())
    # the site-packages this interpreter uses (not the editable install's src/ directory)
    outer = [p for p in sys.path if Path(p).name in ("site-packages", "dist-packages")]
    (inner / "_outer_site.pth").write_text("\n".join(outer) + "\n")
    _run([sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-deps",
          "--no-index", str(wheel)])

    r = _run([str(venv / "bin" / "looprl"), "--help"])
    assert "Usage: looprl" in r.stdout and "train" in r.stdout and "dashboard" in r.stdout

    probe = ("import json, looprl; from importlib.resources import files; "
             f"print(json.dumps([looprl.__file__, [(files('looprl') / p).is_file() for p in {DATA!r}]]))")
    where, present = json.loads(_run([str(py), "-c", probe]).stdout)
    assert Path(where).is_relative_to(inner), f"imported {where}, not the wheel's copy"
    assert all(present), dict(zip(DATA, present, strict=True))

    # the installed dashboard finds its scripts: an export inlines them
    run = tmp_path / "runs" / "tiny"
    run.mkdir(parents=True)
    run.joinpath("metrics.jsonl").write_text(
        "".join(json.dumps({"step": s, "reward/total_mean": 0.1 * s, "train/tokens": 8})
                + "\n" for s in (1, 2)))
    out = tmp_path / "report.html"
    _run([str(venv / "bin" / "looprl"), "dashboard", "export", "--run", str(run), "--out", str(out)])
    page = out.read_text()
    assert "uPlot" in page and 'data-chart="r0-t-0"' in page
