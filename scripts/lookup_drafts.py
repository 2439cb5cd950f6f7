"""How many tokens a verify step would yield if drafts came from the context instead of MTP heads
(prompt-lookup drafting): replayed over a run's sampled RL trajectories.

    .venv/bin/python scripts/lookup_drafts.py runs/quickstart [--ngram 3] [--draft 4]

At each decode step of a trajectory's model tokens, the drafter looks up the last ``ngram``
tokens in everything before them (prompt, tool results, earlier turns) and proposes the up to
``draft`` tokens that followed their latest earlier occurrence. A draft token is counted accepted
when it equals the token the policy actually sampled there: under exact rejection sampling a
one-hot draft ``d`` is accepted with probability p(d), and the sampled token equals ``d`` with that
same probability, so over many steps this is the acceptance the engine would see. The step then
emits the accepted drafts plus one token, as a verify forward does.

What it is for: whether drafting from the context could beat the heads' ~1.9 tokens per verify
step on this workload (issue 26) before building it into the engine.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from looprl.inference.spec import NgramIndex
from looprl.rundir import RunDir


def replay(tokens: list[int], mask: list[int], ngram: int, draft: int) -> tuple[int, int, int]:
    """(model tokens, verify steps, steps that had a draft) for one token sequence."""
    index = NgramIndex(max_n=ngram)  # the engine's: exactly ``ngram`` tokens are looked up here
    emitted = steps = drafted = 0
    pos, n = 0, len(tokens)
    while pos < n:
        if not mask[pos]:  # prompt or tool output: the engine prefills it
            index.extend(tokens[pos:pos + 1])
            pos += 1
            continue
        proposal = index.propose(draft, min_n=ngram)
        accepted = 0
        if proposal:
            drafted += 1
            while (accepted < len(proposal) and pos + accepted < n and mask[pos + accepted]
                   and proposal[accepted] == tokens[pos + accepted]):
                accepted += 1
        # the verify forward's own token, unless the turn ended with the last accepted draft
        step = accepted + (pos + accepted < n and mask[pos + accepted])
        index.extend(tokens[pos:pos + step])
        emitted, steps, pos = emitted + step, steps + 1, pos + step
    return emitted, steps, drafted


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--ngram", type=int, default=3)
    ap.add_argument("--draft", type=int, default=4)
    args = ap.parse_args()
    for run in args.runs:
        emitted = steps = drafted = 0
        with open(RunDir(run).train_trajectories, encoding="utf-8") as f:
            for line in f:
                for seg in json.loads(line)["segments"]:
                    e, s, d = replay(seg["token_ids_T"], seg["loss_mask_T"], args.ngram, args.draft)
                    emitted, steps, drafted = emitted + e, steps + s, drafted + d
        print(f"{run}: {emitted} model tokens in {steps} verify steps: "
              f"tokens_per_verify={emitted / max(steps, 1):.2f} "
              f"steps_with_a_draft={drafted / max(steps, 1):.2f} (ngram {args.ngram}, draft {args.draft})")


if __name__ == "__main__":
    main()
