"""One SFT arm on the pretrained model of a finished ``looprl train`` run: how good a start does
this SFT give, on the run's own demos, seed and held-out tasks?

    .venv/bin/python scripts/sft_probe.py runs/q37s1 --name cosine -o sft.schedule=cosine [--no-eval]

The run's ``config.json`` gives the demos, the SFT config and the evaluation (``-o`` overrides any
of them); its ``model_init/`` (the pretrained default model) is what SFT starts from, so an arm
differs from the run's own SFT only in what ``-o`` changes. The demos are rebuilt as the run built
them and cached in ``RUN/probe/demos_slips<demos.slips>.jsonl``. Output under ``RUN/probe/NAME``: the SFT model and
``result.json``. Measured:

- teacher-forced turn accuracy (``looprl.bench.turns``) on the run's validation demos and on the
  oracle's demos of the held-out tasks (101 ``edit_file`` turns against 32: a less noisy sign);
- held-out pass@1 over ``eval.k`` samples per task, as the run's start evaluation measures it
  (skipped with ``--no-eval``).

Last line: ``name=… sft_minutes=… val_edit_exact=… heldout_edit_exact=… heldout_pass1=…``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import time
from pathlib import Path

import torch

from looprl.bench.turns import turn_accuracy
from looprl.config import apply_overrides, from_dict
from looprl.models.loading import load_model
from looprl.rundir import RunDir
from looprl.tasks.demos import oracle_demos
from looprl.train import stages
from looprl.train.config import TrainConfig
from looprl.train.tasks import TaskSets
from looprl.trainer.sft import sft
from looprl.types import Trajectory


def _cached(path: Path, make) -> list[Trajectory]:
    if path.is_file():
        return [Trajectory.from_json(x) for x in path.read_text().splitlines() if x.strip()]
    trajs = make()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(t.to_json() + "\n" for t in trajs))
    return trajs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run", type=Path, help="a finished run directory (config.json, model_init/, tasks/)")
    ap.add_argument("--name", required=True, help="the arm's name: output in RUN/probe/NAME")
    ap.add_argument("-o", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--no-eval", action="store_true", help="turn accuracy only (no held-out pass@1)")
    args = ap.parse_args()

    rd = RunDir(args.run)
    missing = [str(f.relative_to(rd.root)) for f in (rd.config, rd.model_init / "config.json")
               if not f.is_file()]
    if missing:
        raise SystemExit(f"{args.run} is not a finished run with a pretrained default model (no "
                         f"{', '.join(missing)}); give a directory `looprl train` wrote")
    cfg = from_dict(TrainConfig, apply_overrides(json.loads(rd.config.read_text()), args.overrides))
    sets = TaskSets.load(args.run)
    if sets is None:
        raise SystemExit(f"{args.run} has no tasks/ (run `looprl train` first)")
    out = args.run / "probe" / args.name
    out.mkdir(parents=True, exist_ok=True)
    tok = load_model(rd.model_init).tokenizer
    demos = _cached(args.run / "probe" / f"demos_slips{cfg.demos.slips:g}.jsonl",
                    lambda: stages.make_demos(sets.train, tok, cfg))
    train, val = stages.split_validation(demos, cfg.demos.validation, cfg.seed)
    train = stages.rename_demos(train, tok, cfg)
    held = _cached(args.run / "probe" / "heldout_demos.jsonl", lambda: asyncio.run(oracle_demos(
        [(t, None) for t in sets.heldout], tok, tools=cfg.rollout.tools, workers=cfg.demos.workers)))

    torch.set_num_threads(cfg.model.threads)
    model = load_model(rd.model_init).model
    cfg = stages.fit_precision(cfg, stages.resolve_device("cpu"))
    t0 = time.perf_counter()
    res = sft(model, train, dataclasses.replace(cfg.sft, pad_id=tok.pad_token_id))
    sft_minutes = (time.perf_counter() - t0) / 60
    start = RunDir(out).model_start  # the probe's start model, named as a run names it
    stages.save_model(model, tok, start)
    acc = {"validation": turn_accuracy(model, tok, val), "heldout": turn_accuracy(model, tok, held)}
    result = {"overrides": args.overrides, "sft_steps": res.steps, "sft_minutes": sft_minutes,
              "losses": res.losses, "turns": {k: a.to_json() for k, a in acc.items()}}
    pass1 = float("nan")
    if not args.no_eval:
        rep = stages.evaluate(start, sets.heldout, cfg, args.name,
                              out / "eval_start.jsonl")
        result["eval"] = rep
        pass1 = rep["metrics"]["pass@1"]
    (out / "result.json").write_text(json.dumps(result, indent=1, default=str))
    print(f"name={args.name} sft_minutes={sft_minutes:.1f} "
          f"val_edit_exact={acc['validation'].exact_rate('edit_file'):.3f} "
          f"heldout_edit_exact={acc['heldout'].exact_rate('edit_file'):.3f} "
          f"heldout_pass1={pass1:.4f}")


if __name__ == "__main__":
    main()
