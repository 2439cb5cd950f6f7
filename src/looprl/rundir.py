"""The layout of a run directory, named once: every file and folder a run writes there.

    rd = RunDir(Path("runs/quickstart"))
    rd.config                            # runs/quickstart/config.json
    rd.evaluation("rl", packages=True)   # runs/quickstart/eval_rl_packages.json
    rd.train_trajectories                # runs/quickstart/trajectories/train.jsonl

Writers and readers (training, the trainer, the dashboard, bench, benchmarks and scripts) take
their paths from here, so a name changes in one place. A ``looprl train`` run, stage by stage
(``looprl.train.run``): ``config.json``; ``tasks/``; ``model_init/``, ``demos_validation.jsonl``,
``sft_loss.png``, ``model_start/`` and ``start.json``; ``eval_start*.json``; RL's
``metrics.jsonl``, ``tb/``, ``ckpt/``, ``weights/``, ``trajectories/train.jsonl``, ``fleet.json``,
``infra.json``, ``faults.jsonl`` (with fault injection), ``reward_curve.png``, ``rl.json`` and ``model_rl/``; ``eval_rl*.json``; ``report.md``,
``turn_accuracy.json``, ``dashboard.html``. A real-time loop run (``looprl feedback loop``) shares
``config.json`` and ``report.md`` and adds ``feedback.db``, ``policies/``, ``server.json``,
``users.json``, ``users_tasks.jsonl``, ``gate/``, ``cycles.jsonl``, ``final_ab.json``, ``ab.png``,
``gate.png`` and ``result.txt``.

Only names live here: nothing is created or read (a directory is made by whoever writes into it).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


def eval_name(label: str, packages: bool = False) -> str:
    """The stem an evaluation's report and trajectories share: ``label`` is the checkpoint
    evaluated (``start``, ``rl``, ``v84``: a published version), ``packages`` the held-out
    packages' set (else the held-out functions').

    >>> eval_name("start"), eval_name("rl", packages=True)
    ('eval_start', 'eval_rl_packages')
    """
    return f"eval_{label}{'_packages' if packages else ''}"


@dataclass(frozen=True)
class RunDir:
    """The paths of one run directory under ``root`` (``runs/<name>``)."""

    root: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", Path(self.root))

    # -- both kinds of run ------------------------------------------------------------------------
    @property
    def config(self) -> Path:
        """The resolved config, saved when the run starts (``--resume`` checks against it)."""
        return self.root / "config.json"

    @property
    def report(self) -> Path:
        return self.root / "report.md"

    # -- looprl train: tasks and the start of RL --------------------------------------------------
    @property
    def tasks(self) -> Path:
        """``train.jsonl``, ``heldout.jsonl``, ``heldout_packages.jsonl`` (``TaskSets``)."""
        return self.root / "tasks"

    def task_file(self, split: str) -> Path:
        return self.tasks / f"{split}.jsonl"

    @property
    def model_init(self) -> Path:
        """A copy of the default model before pretraining (absent with ``model.path``)."""
        return self.root / "model_init"

    @property
    def validation_demos(self) -> Path:
        """Demos kept out of SFT, for the turn-accuracy diagnostic."""
        return self.root / "demos_validation.jsonl"

    @property
    def sft_loss(self) -> Path:
        return self.root / "sft_loss.png"

    @property
    def model_start(self) -> Path:
        """The model RL starts from (SFT's result when there were demos)."""
        return self.root / "model_start"

    @property
    def model_sft(self) -> Path:
        """What runs older than ``model_start`` called it; read (for a tokenizer), never written."""
        return self.root / "model_sft"

    @property
    def start_record(self) -> Path:
        """Marks the start stage done: demos, SFT's losses, turn accuracies."""
        return self.root / "start.json"

    def evaluation(self, label: str, packages: bool = False) -> Path:
        """A bench report (``bench.report.summarize``) of a checkpoint (``eval_name``)."""
        return self.root / f"{eval_name(label, packages)}.json"

    # -- looprl train: RL -------------------------------------------------------------------------
    @property
    def metrics(self) -> Path:
        """One JSON row per GRPO step (``trainer.loggers``)."""
        return self.root / "metrics.jsonl"

    @property
    def tensorboard(self) -> Path:
        return self.root / "tb"

    @property
    def wandb_run_id(self) -> Path:
        """The W&B run a resumed run continues."""
        return self.root / "wandb_run_id"

    @property
    def ckpt(self) -> Path:
        """The trainer's checkpoints (``trainer.checkpoint``), the source of truth on resume."""
        return self.root / "ckpt"

    @property
    def weights(self) -> Path:
        """The default weight store (``fleet.experimental.weights_url`` empty): every published version."""
        return self.root / "weights"

    @property
    def trajectories(self) -> Path:
        return self.root / "trajectories"

    def trajectory_file(self, name: str) -> Path:
        """``trajectories/<name>.jsonl``: ``train`` or an evaluation's (``eval_name``)."""
        return self.trajectories / f"{name}.jsonl"

    @property
    def train_trajectories(self) -> Path:
        """Every trained trajectory, its step in ``metadata["train_step"]``."""
        return self.trajectory_file("train")

    def eval_trajectories(self, label: str, packages: bool = False) -> Path:
        return self.trajectory_file(eval_name(label, packages))

    @property
    def fleet(self) -> Path:
        """The Ray fleet's snapshot (``fleet.snapshot``), rewritten every poll."""
        return self.root / "fleet.json"

    @property
    def infra_ledger(self) -> Path:
        """The run's infrastructure failures by class (``faults.InfraLedger``), kept across lives
        of the trainer."""
        return self.root / "infra.json"

    @property
    def fault_books(self) -> Path:
        """The fault injector's own books, a line per step row, when it injected faults."""
        return self.root / "faults.jsonl"

    @property
    def reward_curve(self) -> Path:
        return self.root / "reward_curve.png"

    @property
    def rl_record(self) -> Path:
        """Marks RL done: its summary (``train.stages.RLSummary``)."""
        return self.root / "rl.json"

    @property
    def model_rl(self) -> Path:
        """The trained model (HF format): ``looprl model serve runs/<name>/model_rl``."""
        return self.root / "model_rl"

    @property
    def clock(self) -> Path:
        """Minutes the stages before RL took, over every life of the run (the report's total)."""
        return self.root / "clock.json"

    @property
    def state(self) -> Path:
        """Where the run stands: training, finished, stopped, failed (``looprl.runstate``)."""
        return self.root / "state.json"

    @property
    def saved_models(self) -> tuple[Path, ...]:
        """The models a run may hold, the latest stage's first."""
        return self.model_rl, self.model_start, self.model_sft, self.model_init

    # -- looprl train: the report -----------------------------------------------------------------
    @property
    def turn_accuracy(self) -> Path:
        return self.root / "turn_accuracy.json"

    @property
    def dashboard_page(self) -> Path:
        """The dashboard exported as one page (``dashboard.export_html``)."""
        return self.root / "dashboard.html"

    # -- a real-time loop run ---------------------------------------------------------------------
    @property
    def feedback_db(self) -> Path:
        """The loop's ``FeedbackStore`` (SQLite; a ``-wal`` file beside it while it is open)."""
        return self.root / "feedback.db"

    @property
    def policies(self) -> Path:
        """Every policy the loop trained or served, ``v0000`` on."""
        return self.root / "policies"

    @property
    def cycles(self) -> Path:
        """One JSON row per cycle."""
        return self.root / "cycles.jsonl"

    @property
    def final_ab(self) -> Path:
        return self.root / "final_ab.json"

    @property
    def result(self) -> Path:
        """The loop's one-line ``key=value`` result, written when it ends."""
        return self.root / "result.txt"

    @property
    def server_info(self) -> Path:
        """Where the loop's agent server listens and its token (owner-only): how real users, or
        a client, find it."""
        return self.root / "server.json"

    @property
    def users_summary(self) -> Path:
        """What the simulated users sent (``looprl feedback simulate --out``)."""
        return self.root / "users.json"

    @property
    def users_tasks(self) -> Path:
        """The tasks the simulated users ask about."""
        return self.root / "users_tasks.jsonl"

    def gate_report(self, version: int) -> Path:
        """The bench gate's report of one policy version."""
        return self.root / "gate" / f"v{version:04d}.json"

    @property
    def ab_plot(self) -> Path:
        return self.root / "ab.png"

    @property
    def gate_plot(self) -> Path:
        return self.root / "gate.png"
