"""When in RL did a run's held-out gain come? Evaluate the policy of given trainer steps.

    .venv/bin/python scripts/eval_version.py runs/quickstart 84 168

Each step's weights are rebuilt from the run's weight store (``RUN/weights``: what the rollout
engine ran after that step, in the store's bf16) on ``model_start``'s architecture and tokenizer,
then evaluated on the run's held-out functions (``--set packages``: its whole held-out packages)
with the run's own evaluation settings (``eval``), written to ``RUN/eval_v<STEP>.json``
(``eval_v<STEP>_packages.json``) and compared, paired over the same tasks, with the start's
evaluation and with the RL model's (when the run has them). One line per step:
``version=… pass1=… minus_start=… (… … …) minus_rl=… (… … …) broken_per_call=…``.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from looprl.bench.gate import compare, load
from looprl.config import from_dict
from looprl.rundir import RunDir
from looprl.train import stages
from looprl.train.config import TrainConfig
from looprl.train.tasks import TaskSets
from looprl.weights.store import FsspecWeightStore


def materialize(run: Path, store: FsspecWeightStore, version: int, dest: Path) -> Path:
    """``version``'s weights saved as a checkpoint at ``dest`` (model_start's config, tokenizer)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    start = RunDir(run).model_start
    model = AutoModelForCausalLM.from_pretrained(start, dtype=torch.float32)
    state = {k: t.float() for k, t in store.fetch(version).items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected or missing:
        raise SystemExit(f"version {version} does not fit {start}: "
                         f"{len(missing)} tensors missing, {len(unexpected)} unexpected")
    return stages.save_model(model, AutoTokenizer.from_pretrained(start), dest)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run", type=Path, help="a run directory `looprl train` wrote, RL started")
    ap.add_argument("versions", type=int, nargs="+", help="trainer steps (weight versions)")
    ap.add_argument("--set", choices=("functions", "packages"), default="functions",
                    help="the held-out functions, or the whole held-out packages")
    args = ap.parse_args()
    rd = RunDir(args.run)
    sets = TaskSets.load(args.run)
    if sets is None or not rd.weights.is_dir():
        raise SystemExit(f"{args.run} has no tasks/ or no weights/: give a run that reached RL")
    cfg = from_dict(TrainConfig, json.loads(rd.config.read_text()))
    store = FsspecWeightStore(str(rd.weights))
    known = set(store.versions())
    absent = [v for v in args.versions if v not in known]
    if absent:
        raise SystemExit(f"{rd.weights} holds no version {absent[0]} "
                         f"(it holds {min(known)}..{max(known)})" if known else
                         f"{rd.weights} holds no versions")
    packages = args.set == "packages"
    tasks = sets.heldout_packages if packages else sets.heldout
    if not tasks:
        raise SystemExit(f"{args.run} has no held-out {args.set}")
    refs = {name: load(rd.evaluation(name, packages)) for name in ("start", "rl")
            if rd.evaluation(name, packages).is_file()}
    for v in args.versions:
        out = rd.evaluation(f"v{v}", packages)
        with tempfile.TemporaryDirectory() as tmp:
            model_dir = materialize(args.run, store, v, Path(tmp) / f"v{v}")
            rep = stages.evaluate(model_dir, tasks, cfg, f"v{v}{'_packages' if packages else ''}")
        out.write_text(json.dumps(rep))
        m = rep["metrics"]
        line = f"version={v} pass1={m['pass@1']:.4f}"
        for name, ref in refs.items():
            d = compare(ref, rep, seed=cfg.seed).diffs[0]
            line += f" minus_{name}={d.diff:+.4f} ({d.lo:+.4f} … {d.hi:+.4f})"
        print(line + f" broken_per_call={m['broken_tool_call_rate']:.3f}", flush=True)


if __name__ == "__main__":
    main()
