"""One real-time window trained offline, as ``looprl feedback loop`` trains it, on the sessions a
loop run stored; the candidate is benched on the users' own requests beside the policy that
served them, with the server's settings. How big a step can a window take, with which objective?

    .venv/bin/python scripts/window_step.py runs/rt32b --sessions 64 \
        -o grpo.lr=3e-4 -o grpo.negative_advantage_scale=0 [--k 5] [--name lr3e-4]

The run's ``config.json`` gives the users' tasks, the server's settings, the signal and the GRPO
config (``-o`` overrides any of them). The window is the first ``--sessions`` scored sessions of
``--version`` (trained on by a cycle or not), grouped as the loop groups them. Output under
``RUN/offline/NAME``: the candidate and ``bench.json``; the serving policy's bench is
``RUN/offline/base_k{K}.json``, made once. Last line:
``candidate_pass1=… base_pass1=… diff=… ci_low=… ci_high=… sessions=…`` (paired bootstrap over
the requests).

Before the benches it prints how far the window moved the policy: the weights' relative change
(‖Δθ‖ / ‖θ‖) and the mean KL(serving ‖ candidate) per model token over the window's first 32
sessions. ``--no-bench`` stops there (seconds, not minutes). ``-o optimizer=runs/quickstart/ckpt``
continues the Adam state of the run that trained the serving policy, as the loop can.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import torch

from looprl.bench.run import BenchSettings
from looprl.config import apply_overrides, from_dict
from looprl.feedback.gate import bench_policy, gate_reports
from looprl.feedback.policies import PolicyRef, read_policy, save_candidate
from looprl.feedback.realtime_config import RealtimeConfig, users_tasks
from looprl.feedback.store import FeedbackStore
from looprl.feedback.update import optimizer_state, train_groups
from looprl.feedback.window import window, window_groups
from looprl.rundir import RunDir


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path, help="a loop run directory (config.json, feedback.db)")
    ap.add_argument("--sessions", type=int, default=64, help="the window's size")
    ap.add_argument("--version", type=int, default=0, help="the policy version that served them")
    ap.add_argument("--k", type=int, default=5, help="samples per request in the benches")
    ap.add_argument("--name", default="", help="output name (default: from the overrides)")
    ap.add_argument("--no-bench", action="store_true", help="measure the step, bench nothing")
    ap.add_argument("-o", "--override", action="append", default=[], help="config key=value")
    a = ap.parse_args()
    rd = RunDir(a.run)
    data = apply_overrides(json.loads(rd.config.read_text()), a.override)
    cfg = from_dict(RealtimeConfig, data)
    policy = read_policy(rd.policies / f"v{a.version:04d}")
    policy = PolicyRef(policy.path, a.version)  # the version its sessions carry (v0000 links to
    # the start model, whose own metadata may name another)
    trajs = window(FeedbackStore(rd.feedback_db), a.version, cfg.signal,
                   untrained=False)[:a.sessions]
    if not trajs:
        raise SystemExit(f"{a.run} holds no scored session of v{a.version}")
    groups = window_groups(trajs, {}, "offline")
    model, tok, m, _ = train_groups(policy, groups, cfg.grpo, cfg.steps, cfg.seed,
                                    optimizer_state(policy.path, cfg.optimizer))
    print(f"trained on {len(trajs)} sessions ({len(groups)} groups): loss {m['loss']:+.4f}, "
          f"grad norm {m['grad_norm']:.4f}, {m['updates']:.0f} updates")
    rel, kl = policy_change(policy.path, model, trajs[:32])
    print(f"relative_update={rel:.5f} kl_per_token={kl:.5f}")
    if a.no_bench:
        return
    root = rd.root / "offline"  # this script's own
    out = root / (a.name or ("_".join(a.override) or "default").replace("/", "-"))
    cand = save_candidate(model, tok, out, a.version + 1, {"parent_version": a.version,
                                                            "sessions": len(trajs)})
    del model
    s = cfg.serve
    st = BenchSettings(max_turns=s.max_turns, max_new_tokens=s.max_new_tokens,
                       context_window=s.context_window, concurrency=16)
    tasks = users_tasks(cfg)
    base = bench_policy(policy.path, tasks, a.k, st, root / f"base_k{a.k}.json")
    got = bench_policy(cand, tasks, a.k, st, out / "bench.json")
    g = gate_reports(base, got, max_drop=1.0)
    if g["passed"] is None:
        raise SystemExit(g["reason"])
    print(f"candidate_pass1={g['pass1_candidate']:.4f} base_pass1={g['pass1_current']:.4f} "
          f"diff={g['pass1_candidate'] - g['pass1_current']:+.4f} ci_low={g['ci_low']:+.4f} "
          f"ci_high={g['ci_high']:+.4f} sessions={len(trajs)}")


def policy_change(parent_dir: Path, model: torch.nn.Module, trajs: list) -> tuple[float, float]:
    """(‖θ' − θ‖ / ‖θ‖, mean KL(parent ‖ model) per model token of ``trajs``)."""
    from looprl.models.loading import load_model

    parent = load_model(parent_dir, dtype="float32").model.eval()
    model.eval()
    with torch.no_grad():
        num = den = 0.0
        for p0, p1 in zip(parent.parameters(), model.parameters(), strict=True):
            num += float(((p1 - p0) ** 2).sum())
            den += float((p0 ** 2).sum())
        kl = tokens = 0.0
        for t in trajs:
            for s in t.segments:
                ids = torch.tensor([s.token_ids_T])
                mask = torch.tensor(s.loss_mask_T[1:], dtype=torch.bool)
                lp = torch.log_softmax(parent(ids).logits[0, :-1].float(), -1)[mask]
                lq = torch.log_softmax(model(ids).logits[0, :-1].float(), -1)[mask]
                kl += float((lp.exp() * (lp - lq)).sum())
                tokens += int(mask.sum())
    return math.sqrt(num / max(den, 1e-30)), kl / max(tokens, 1)


if __name__ == "__main__":
    main()
