"""looprl's GRPO (TorchEngine + GRPOStep) against TRL's ``GRPOTrainer``: wall-clock to the same
training reward, same model, prompts, reward and algorithm.

    .venv/bin/pip install -e ".[trl]"    # trl 1.16.0 (pyproject's extra; `make bench` does it)
    .venv/bin/python benchmarks/vs_trl.py                      # ~4 min on 2 quiet cores
    .venv/bin/python benchmarks/vs_trl.py --size small         # the quickstart's model, ~5x longer
    .venv/bin/python benchmarks/vs_trl.py --prompt-form bare   # the task prompt alone (short)

Both sides start from the same default model (``init_default_model(size=...)``, saved HF dir).
The task form both can run: single-turn prompts from the real inflection tasks, by default in the
agent's real first-turn form (the harness's tool schemas rendered by the chat template, then the
task's terse prompt: ~1,800 tokens, the context every rollout starts from), ``G`` completions per
prompt, and a pure reward on the completion text both compute with the same function
(``name_reward``: half for using the letters of the function under repair, which a random-init
model learns in a few steps, half for spelling it whole, which takes longer, so the reward does
not saturate early; the agent's real reward needs sandboxes TRL cannot drive).

Same algorithm on both: Dr. GRPO (``loss_type="dr_grpo"``, ``scale_rewards="none"``, no KL, one
update per batch, the loss summed over tokens and divided by sequences x completion length on
both), AdamW with the same betas, no weight decay, gradient norm clipped at 1.0, same lr,
temperature 1 with no top-k/top-p, same prompts per step, G and completion length; TRL without
gradient checkpointing (trl 1.16 turns it on by default; looprl's step does not recompute).

Fairness of the clock: the two sides take steps in turn in one process (``Turns``: a looprl step,
then a TRL step in its thread, ...), so other jobs' load falls on both alike, and each side's
time is the sum of its own steps only.

Reported: the reward curve of each (smoothed over ``--window`` steps); the target is 80% of the way
from the start reward to the best reward *both* reached; time-to-target on each side and the
ratio. If either side fails to improve, the output says so and compares time per step at equal
work instead. Rollout and training tokens/s are printed side by side (TRL's generation time is
its ``_generate_and_score_completions``, timed by wrapping that method on the instance).
The last line is ``speedup_vs_trl=… trl_s=… looprl_s=… target_reward=… …``.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field

import torch

from looprl.inference import TorchEngine
from looprl.models.loading import load_model
from looprl.models.tiny import default_model_dir
from looprl.trainer.config import GRPOConfig, GRPOExperimental
from looprl.trainer.losses import LossParams
from looprl.trainer.step import GRPOStep
from looprl.types import (
    Counters,
    Group,
    RewardBreakdown,
    SamplingParams,
    Segment,
    StopReason,
    Trajectory,
)


def name_reward(completion: str, name: str) -> float:
    """Half the share of the completion's non-space characters that occur in ``name`` (easy:
    a few steps teach a random model to use those letters), half the share of them inside whole
    occurrences of ``name`` (hard: it must spell it), so the reward keeps climbing after the
    easy half saturates.

    >>> name_reward("titleize ok", "titleize")
    0.8
    >>> round(name_reward("titleizetitleize", "titleize"), 3)
    1.0
    >>> name_reward("", "titleize")
    0.0
    """
    chars = "".join(c for c in completion if not c.isspace())
    if not chars:
        return 0.0
    letters = sum(c in name for c in chars) / len(chars)
    spelled = chars.count(name) * len(name) / len(chars) if name else 0.0
    return 0.5 * letters + 0.5 * spelled


@dataclass(frozen=True)
class Prompt:
    text: str
    function: str


class Turns:
    """Steps taken in turn: the looprl side runs one step, then hands the machine to TRL's
    trainer (in a thread of its own) for one, and waits for it to finish, so the other jobs'
    load falls on both sides alike and neither runs while the other is timed."""

    def __init__(self) -> None:
        self.go, self.done = threading.Event(), threading.Event()
        self.finished = False
        self.error: BaseException | None = None

    def trl_turn(self) -> None:
        """The looprl side's: let TRL run one step, wait for it (or for its end); a failure of
        the TRL side, even before its first step, stops the looprl side here."""
        if not self.finished:
            self.done.clear()
            self.go.set()
            self.done.wait()
        if self.error is not None:
            raise RuntimeError(f"the TRL side failed: {self.error}") from self.error

    def wait_turn(self) -> None:
        """TRL's, at the start of each of its steps."""
        self.go.wait()
        self.go.clear()

    def end_turn(self, finished: bool = False) -> None:
        self.finished = self.finished or finished
        self.done.set()


@dataclass
class Curve:
    """Per-step reward and elapsed time of one side, plus its token counts."""

    rewards: list[float] = field(default_factory=list)
    elapsed_s: list[float] = field(default_factory=list)
    rollout_tokens: int = 0
    train_tokens: int = 0
    rollout_s: float = 0.0
    train_s: float = 0.0


def prompts_from_tasks(tok, spec: str, form: str) -> list[Prompt]:
    """``form="agent"``: the agent's real first turn (the harness's tool schemas rendered by the
    chat template, then the task's prompt); ``"bare"``: the task's prompt alone."""
    from looprl.chat import ChatFormat
    from looprl.harness.tools import DEFAULT_TOOLS, make_tools, tool_schemas
    from looprl.tasks.build import BuildConfig, build_package_tasks
    from looprl.tasks.sources import fetch_package

    tasks = build_package_tasks(fetch_package(spec), BuildConfig(max_tasks=20))
    schemas = tool_schemas(make_tools(DEFAULT_TOOLS)) if form == "agent" else None
    fmt = ChatFormat(tok)
    out = []
    for t in tasks:
        fn = str(t.metadata.get("functions") or t.prompt.split()[-1]).split(",")[0]
        out.append(Prompt(fmt.render([{"role": "user", "content": t.prompt}], schemas), fn))
    return out


# ----------------------------------------------------------------------------- looprl side

def run_looprl(model_dir, prompts: list[Prompt], args: argparse.Namespace, turns: Turns) -> Curve:
    lm = load_model(model_dir)
    tok = lm.tokenizer
    torch.manual_seed(args.seed)
    longest = max(len(tok.encode(p.text, add_special_tokens=False)) for p in prompts)
    engine = TorchEngine(copy.deepcopy(lm.model), tok, max_len=longest + args.max_new_tokens + 8,
                         seed=args.seed)
    step = GRPOStep(lm.model.train(), GRPOConfig(
        lr=args.lr, loss="dr_grpo", std_norm="never",
        experimental=GRPOExperimental(objective=LossParams(norm_tokens=args.max_new_tokens))),
                    pad_id=tok.pad_token_id)
    params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=1.0)
    curve, own = Curve(), 0.0  # own: this side's step time, without TRL's turns

    async def sample(p: Prompt, gid: str, ids: list[int]) -> Trajectory:
        g = await engine.generate(ids, params, group_id=gid)
        text = tok.decode(list(g.token_ids), skip_special_tokens=True)
        n = len(ids)
        seg = Segment(tuple(ids) + g.token_ids, (0.0,) * n + g.logprobs, (0,) * n + (1,) * len(g.token_ids),
                      (-1,) * n + g.policy_versions)
        return Trajectory(p.function, gid, (seg,), (), Counters(output_tokens=len(g.token_ids)),
                          StopReason.FINISHED, reward=RewardBreakdown.of({"name": name_reward(text, p.function)}))

    async def group(gid: str, p: Prompt) -> Group:
        ids = tok.encode(p.text, add_special_tokens=False)
        trajs = await asyncio.gather(*(sample(p, gid, ids) for _ in range(args.group_size)))
        return Group(p.function, gid, tuple(trajs))

    async def main() -> None:
        nonlocal own
        for s in range(args.steps):
            tr = time.monotonic()
            batch = [prompts[(s * args.prompts_per_step + i) % len(prompts)] for i in range(args.prompts_per_step)]
            # Every completion of the step decodes in one continuous batch (TRL: one generate call).
            groups = list(await asyncio.gather(*(group(f"{s}-{i}", p) for i, p in enumerate(batch))))
            curve.rollout_s += time.monotonic() - tr
            tt = time.monotonic()
            m = await asyncio.to_thread(step.on_groups, groups, current_version=s)
            await engine.update_weights({k: v.detach().clone() for k, v in step.model.state_dict().items()}, s + 1)
            curve.train_s += time.monotonic() - tt
            trajs = [t for g in groups for t in g.trajectories]
            curve.rollout_tokens += sum(t.counters.output_tokens for t in trajs)
            curve.train_tokens += sum(len(t.segments[0].token_ids_T) for t in trajs)
            curve.rewards.append(sum(t.reward.total for t in trajs) / len(trajs))
            own += time.monotonic() - tr
            curve.elapsed_s.append(own)
            if (s + 1) % 10 == 0:
                print(f"  [looprl] step {s + 1} reward {curve.rewards[-1]:.3f} t={curve.elapsed_s[-1]:.1f}s "
                      f"(kl {m.kl_mean:.4f})", flush=True)
            await asyncio.to_thread(turns.trl_turn)

    try:
        asyncio.run(main())
    finally:
        engine.close()
    return curve


# ----------------------------------------------------------------------------- TRL side

def run_trl(model_dir, prompts: list[Prompt], args: argparse.Namespace, turns: Turns) -> Curve:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig as TRLConfig
    from trl import GRPOTrainer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    n = args.steps * args.prompts_per_step
    ds = Dataset.from_list([{"prompt": prompts[i % len(prompts)].text,
                             "function": prompts[i % len(prompts)].function} for i in range(n)])
    curve = Curve()
    step_rewards: list[float] = []

    def reward(prompts, completions, function, completion_ids=None, **kw) -> list[float]:
        curve.rollout_tokens += sum(len(c) for c in completion_ids) if completion_ids else 0
        rs = [name_reward(c, f) for c, f in zip(completions, function, strict=True)]
        step_rewards.append(sum(rs) / len(rs))
        return rs

    with tempfile.TemporaryDirectory() as out:
        cfg = TRLConfig(
            output_dir=out, use_cpu=True, report_to="none", save_strategy="no", logging_steps=10,
            disable_tqdm=True,
            max_steps=args.steps, learning_rate=args.lr, lr_scheduler_type="constant", warmup_steps=0,
            per_device_train_batch_size=args.prompts_per_step * args.group_size,
            num_generations=args.group_size, max_completion_length=args.max_new_tokens,
            temperature=1.0, top_p=1.0, loss_type="dr_grpo", scale_rewards="none", beta=0.0,
            num_iterations=1, seed=args.seed, shuffle_dataset=False, bf16=False,
            max_grad_norm=1.0, weight_decay=0.0, dataloader_num_workers=0, disable_dropout=True,
            # trl 1.16 turns checkpointing on by default; looprl's step does not recompute
            gradient_checkpointing=False)
        trainer = GRPOTrainer(model=model, reward_funcs=reward, args=cfg, train_dataset=ds,
                              processing_class=tok)
        gen = trainer._generate_and_score_completions

        def timed_gen(*a, **k):
            t = time.monotonic()
            try:
                res = gen(*a, **k)
            finally:
                curve.rollout_s += time.monotonic() - t
            mask = res.get("completion_mask")
            curve.train_tokens += int(res["prompt_mask"].sum() + (mask.sum() if mask is not None else 0))
            return res

        trainer._generate_and_score_completions = timed_gen
        began, own = [0.0], [0.0]  # own: this side's step time, without looprl's turns

        class Clock(TrainerCallback):
            def on_step_begin(self, *a, **k):
                turns.wait_turn()
                began[0] = time.monotonic()

            def on_step_end(self, *a, **k):
                own[0] += time.monotonic() - began[0]
                curve.elapsed_s.append(own[0])
                curve.rewards.append(step_rewards[-1])
                if len(curve.rewards) % 10 == 0:
                    print(f"  [trl] step {len(curve.rewards)} reward {curve.rewards[-1]:.3f} "
                          f"t={curve.elapsed_s[-1]:.1f}s", flush=True)
                turns.end_turn()

        trainer.add_callback(Clock())
        trainer.train()
    curve.train_s = curve.elapsed_s[-1] - curve.rollout_s if curve.elapsed_s else 0.0
    return curve


# ----------------------------------------------------------------------------- comparison

def smooth(xs: list[float], w: int) -> list[float]:
    return [sum(xs[max(0, i - w + 1):i + 1]) / len(xs[max(0, i - w + 1):i + 1]) for i in range(len(xs))]


def time_to(curve: Curve, target: float, w: int) -> float | None:
    for r, t in zip(smooth(curve.rewards, w), curve.elapsed_s, strict=True):
        if r >= target:
            return t
    return None


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--prompts-per-step", type=int, default=2)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--size", default="tiny", help="default model size (tiny keeps the run ~15 min; "
                   "the quickstart trains small: --size small, ~5x longer)")
    p.add_argument("--prompt-form", choices=["agent", "bare"], default="agent",
                   help="agent: the harness's first turn with its tool schemas (what the policy "
                        "sees in training); bare: the task prompt alone")
    p.add_argument("--lr", type=float, default=1e-2,
                   help="high, as fits a random-init model and a toy reward; same on both sides")
    p.add_argument("--window", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--package", default="inflection==0.5.1")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


def main() -> int:
    try:
        import trl  # noqa: F401
    except ImportError:
        print('TRL is not installed; install the trl extra (pinned; leaves the CPU torch as it is):\n'
              '  .venv/bin/pip install -e ".[trl]"', file=sys.stderr)
        return 2
    args = parse_args()
    torch.set_num_threads(args.threads)
    model_dir = default_model_dir(args.size)
    tok = load_model(model_dir).tokenizer
    prompts = prompts_from_tasks(tok, args.package, args.prompt_form)
    n_prompt = sorted(len(tok.encode(p.text, add_special_tokens=False)) for p in prompts)
    print(f"{len(prompts)} prompts from {args.package} ({args.prompt_form} form, median "
          f"{n_prompt[len(n_prompt) // 2]} tokens); {args.size} model; {args.steps} steps x {args.prompts_per_step} "
          f"prompts x G={args.group_size} x {args.max_new_tokens} tokens; lr {args.lr}", flush=True)
    turns = Turns()
    trl_curve: list[Curve] = []

    def trl_side() -> None:
        torch.set_num_threads(args.threads)  # per OS thread
        try:
            trl_curve.append(run_trl(model_dir, prompts, args, turns))
        except BaseException as e:  # noqa: BLE001 — reported by the looprl side's next turn
            turns.error = e
        finally:
            turns.end_turn(finished=True)

    trl_thread = threading.Thread(target=trl_side, name="trl", daemon=True)
    trl_thread.start()
    ours = run_looprl(model_dir, prompts, args, turns)
    trl_thread.join()
    turns.trl_turn()  # raises what the TRL side failed with after looprl's last turn
    [theirs] = trl_curve
    w = args.window
    start = (sum(ours.rewards[:w]) + sum(theirs.rewards[:w])) / (2 * w)
    best = min(max(smooth(ours.rewards, w)), max(smooth(theirs.rewards, w)))
    target = start + 0.8 * (best - start)
    t_ours, t_trl = time_to(ours, target, w), time_to(theirs, target, w)
    for name, c in (("looprl", ours), ("trl", theirs)):
        print(f"{name:>6}: reward {c.rewards[0]:.3f} -> {smooth(c.rewards, w)[-1]:.3f} (smoothed) | "
              f"{c.elapsed_s[-1]:.1f}s for {len(c.rewards)} steps ({c.elapsed_s[-1] / len(c.rewards):.2f} s/step) | "
              f"rollout {c.rollout_tokens / max(c.rollout_s, 1e-9):.0f} tok/s | "
              f"train {c.train_tokens / max(c.train_s, 1e-9):.0f} tok/s", flush=True)
    per_step = (theirs.elapsed_s[-1] / len(theirs.rewards)) / (ours.elapsed_s[-1] / len(ours.rewards))
    common = (f"trl_s_per_step={theirs.elapsed_s[-1] / len(theirs.rewards):.3f} "
              f"looprl_s_per_step={ours.elapsed_s[-1] / len(ours.rewards):.3f} "
              f"rollout_tok_s_looprl={ours.rollout_tokens / max(ours.rollout_s, 1e-9):.0f} "
              f"rollout_tok_s_trl={theirs.rollout_tokens / max(theirs.rollout_s, 1e-9):.0f} "
              f"train_tok_s_looprl={ours.train_tokens / max(ours.train_s, 1e-9):.0f} "
              f"train_tok_s_trl={theirs.train_tokens / max(theirs.train_s, 1e-9):.0f} target_speedup=3")
    if best - start < 0.02 or t_ours is None or t_trl is None:
        print(f"equal reward not reached on both sides within {args.steps} steps (start {start:.3f}, "
              f"best both reached {best:.3f}); comparing time per step at equal work instead")
        print(f"speedup_vs_trl={per_step:.2f} mode=time_per_step {common}")
        return 0
    print(f"speedup_vs_trl={t_trl / t_ours:.2f} mode=time_to_reward trl_s={t_trl:.1f} looprl_s={t_ours:.1f} "
          f"target_reward={target:.3f} start_reward={start:.3f} per_step_speedup={per_step:.2f} {common}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
