#!/bin/bash
# The fault drill (issue 51, docs/faults.md): `looprl train` on quickstart tasks with every fault
# class of the taxonomy injected at >= 5% of its boundary's crossings, for >= 10 minutes of RL,
# relaunched with --resume after each injected process kill until it exits 0; then
# scripts/fault_drill_check.py checks the run directory.
#
#     nice -n 10 scripts/fault_drill.sh [RUNS_DIR] [NAME] [-o FIELD=VALUE ...]
#
# from the repo root; default runs/fault_drill. Options after NAME go to `looprl train`, e.g.
# `-o model.path=runs/quickstart/model_start` to start from a model that already edits files.
#
# What it runs: configs/quickstart.toml's inflection tasks (its build, from the task cache),
# four held out; no pretraining (its 300 steps take an hour on two busy cores), the
# quickstart's synthetic SFT demos, 30% of them running the tests between their edit and finish
# (demos.experimental.verifies): the drill need not learn, but a policy that never edits makes
# no diff to grade and one that never runs a command never crosses the exec boundary (SFT on the
# nine train tasks' demos alone broke every call); ten walks over the train tasks end RL (>= 10 min here), so every
# task must be trained exactly ten times; rollouts on a Ray fleet of
# this machine (a one-node Ray the run starts; node_lost kills that node's actors) whose
# sandboxes are reached over HTTP (env_server_5xx, connection_dropped); every class at 5%, the
# process kill at 20% of step rows (about 14 rows: at 5% most drills would see no kill), a
# command's hang at 30%: a weak policy's own commands are mostly invalid calls that never reach
# the sandbox, and a group's identical diffs are graded once, so at 5% the class saw no crossing
# that fired; a replica's weight load at 15%: about 20 loads a drill, and at 5% none fired in one.
# Short rollouts (3 turns of 96 tokens: an edit call, run_tests, finish; groups of 2, 4 in flight): with one node, a node_lost at
# 5% of attempts takes every attempt in flight, and the node's restart costs about a minute on 2
# busy cores; groups of 4 with 8 in flight trained no step in 5 minutes.
# Each life's output goes to RUNS_DIR/NAME.lifeN.log, one line per life to RUNS_DIR/NAME.lives;
# running the script again with the same RUNS_DIR and NAME resumes the drill.
set -u
RUNS=${1:-runs}
NAME=${2:-fault_drill}
EXTRA=("${@:3}")
PY=${PYTHON:-.venv/bin/python}
ARGS=(-c configs/quickstart.toml --runs "$RUNS" -o name="$NAME"
  -o 'tasks.train_packages=["inflection==0.5.1"]' -o 'tasks.experimental.train_only_packages=[]'
  -o 'tasks.heldout_packages=[]' -o tasks.experimental.max_heldout=4
  -o model.experimental.pretrain_steps=0 -o model.experimental.drills=0
  -o demos.experimental.verifies=0.3 -o eval.k=1
  -o fleet.backend=ray -o fleet.experimental.node_ip=127.0.0.2 -o fleet.experimental.sandboxes=http
  -o fleet.experimental.sandboxes_per_node=8 -o fleet.experimental.wait_for_nodes_s=600
  -o rollout.group_size=2 -o rollout.max_in_flight=4 -o rollout.experimental.max_infra_retries=10
  -o rollout.agent.max_turns=3 -o rollout.agent.max_new_tokens=96
  -o rollout.agent.max_total_new_tokens=288
  -o loop.groups_per_step=2 -o loop.experimental.queue_size=2 -o loop.max_minutes=40 -o loop.experimental.passes=10
  -o loop.experimental.checkpoint_every=1 -o loop.experimental.max_staleness=1000
  -o faults.rates.all=0.05 -o faults.rates.process_killed=0.2 -o faults.rates.exec_timeout=0.3 -o faults.rates.weight_read=0.15 -o faults.seed=1 "${EXTRA[@]}")
mkdir -p "$RUNS"
life=0
resume=()
# run again after a life ended for a reason outside the injector, the drill goes on from there
if [ -s "$RUNS/$NAME.lives" ]; then
  life=$(wc -l < "$RUNS/$NAME.lives")
  resume=(--resume)
fi
while true; do
  start=$(date +%s)
  "$PY" -m looprl train "${ARGS[@]}" "${resume[@]}" > "$RUNS/$NAME.life$life.log" 2>&1
  rc=$?
  echo "life $life exit $rc $(date -Is) wall $(( $(date +%s) - start ))s" >> "$RUNS/$NAME.lives"
  [ $rc -eq 0 ] && break
  [ $rc -ne 137 ] && { echo "life $life failed (exit $rc): $RUNS/$NAME.life$life.log" >&2; exit $rc; }
  life=$((life + 1))
  resume=(--resume)
  [ $life -ge 20 ] && { echo "20 lives without finishing" >&2; exit 1; }
done
"$PY" scripts/fault_drill_check.py "$RUNS/$NAME"
