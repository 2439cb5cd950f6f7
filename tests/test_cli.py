"""The ``looprl`` command line as a user meets it: bad input of any command ends with one line on
stderr (``error: ...``) and exit code 2, never a traceback (``--debug`` / LOOPRL_DEBUG=1 add it);
nothing is created where a command was only meant to read; start-up imports nothing heavy."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from looprl.cli import SUBCOMMANDS, app

HEAVY = ("torch", "transformers", "tokenizers", "safetensors", "numpy", "hnswlib", "fastapi",
         "starlette", "uvicorn", "httpx", "fsspec", "matplotlib", "datasets")
LOOPRL = [sys.executable, "-c", "import sys; from looprl.cli import app; sys.exit(app())"]


def looprl(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None
           ) -> subprocess.CompletedProcess[str]:
    """The real CLI in a fresh interpreter, as the console script runs it."""
    return subprocess.run([*LOOPRL, *args], capture_output=True, text=True, timeout=120, cwd=cwd,
                          env={**os.environ, **(env or {})})


def test_start_up_and_every_help_import_nothing_heavy():
    code = ("import sys\nfrom typer.testing import CliRunner\nfrom looprl.cli import SUBCOMMANDS, app\n"
            "r = CliRunner()\nassert r.invoke(app, ['--help']).exit_code == 0\n"
            "for name, _, _ in SUBCOMMANDS:\n"
            "    assert r.invoke(app, [name, '--help']).exit_code == 0, name\n"
            f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("command", ["train", "quickstart"])
@pytest.mark.parametrize("bad", [["-o", "loop.no_such_field=1"], ["-o", "rollout.group_size=-3"],
                                 ["-c", "BAD_TOML"], ["-o", "model.engine=openai"]])
def test_a_config_error_comes_before_anything_heavy_is_imported(command, bad, tmp_path):
    # the config is read and checked before the composition root loads torch and transformers
    # (8-15 s on a loaded machine): a typo is one line in about a second
    toml = tmp_path / "bad.toml"
    toml.write_text("this is = not [toml\n")
    args = [a.replace("BAD_TOML", str(toml)) for a in bad]
    if command == "train" and args[0] != "-c":
        args = ["-c", str(Path(__file__).parents[1] / "configs" / "quickstart.toml"), *args]
    code = ("import sys\nfrom typer.testing import CliRunner\nfrom looprl.cli import app\n"
            f"r = CliRunner().invoke(app, {[command, *args, '--runs', str(tmp_path)]!r})\n"
            "print(r.exit_code, r.output.strip().splitlines()[-1])\n"
            f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    status, heavy = out.stdout.strip().splitlines()[-2:]
    assert status.startswith("2 error: "), status
    assert heavy == "[]", f"validating a config imported {heavy}"
    assert not list(tmp_path.glob("*/")), "a config error must not claim a run directory"


def test_help_lists_every_group():
    out = CliRunner().invoke(app, ["--help"], terminal_width=200)
    assert out.exit_code == 0
    for name, _, _ in SUBCOMMANDS:
        assert f" {name} " in out.output


# ----------------------------------------------------------------------------- the real CLI

def _one_error_line(r: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr + r.stdout
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    for n in needles:
        assert n in lines[0]


def test_missing_config_file_is_one_line(tmp_path):
    _one_error_line(looprl("train", "-c", str(tmp_path / "missing.toml")), "missing.toml",
                    "does not exist")


def test_a_store_that_must_exist_is_not_created(tmp_path):
    typo = tmp_path / "typo.db"
    _one_error_line(looprl("feedback", "cycle", "--store", str(typo), "--model", str(tmp_path),
                           "--out", str(tmp_path / "policies")), "--store", "does not exist")
    _one_error_line(looprl("feedback", "sessions", "--store", str(typo)), "typo.db")
    assert not typo.exists()


def test_a_looprl_error_is_one_line_and_debug_adds_the_traceback(tmp_path):
    _one_error_line(looprl("weights", "ls", str(tmp_path / "nope")), "no weight store")
    for r in (looprl("--debug", "weights", "ls", str(tmp_path / "nope")),
              looprl("weights", "ls", str(tmp_path / "nope"), env={"LOOPRL_DEBUG": "1"})):
        assert r.returncode == 2
        assert "Traceback" in r.stderr and "WeightStoreError" in r.stderr
        assert r.stderr.splitlines()[-1].startswith("error: no weight store")
    assert not (tmp_path / "nope").exists()


def test_unknown_command_and_option_are_one_line():
    _one_error_line(looprl("nosuch"), "No such command")
    _one_error_line(looprl("--nosuch"), "No such option")


def test_a_bare_group_prints_its_help():
    r = looprl("tasks")
    assert "fetch" in r.stdout and "build" in r.stdout and "error" not in r.stderr


# ----------------------------------------------------------------------------- every command

@pytest.fixture
def files(tmp_path: Path) -> dict[str, str]:
    """Paths the table below refers to by name."""
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "bad.jsonl").write_text('{"task_id": "t"}\n')
    (tmp_path / "not-a-report.json").write_text(json.dumps({"x": 1}))
    (tmp_path / "dir").mkdir()
    return {"EMPTY": str(tmp_path / "empty.jsonl"), "BAD": str(tmp_path / "bad.jsonl"),
            "REPORT": str(tmp_path / "not-a-report.json"), "DIR": str(tmp_path / "dir"),
            "MISSING": str(tmp_path / "missing"), "OUT": str(tmp_path / "out")}


# (argv, what the one line must say). Every one fails before any work starts.
CASES: list[tuple[list[str], str]] = [
    # the training config: types, unknown keys and choices checked at load, real section names
    (["quickstart", "-o", "loop.max_minutes=abc"], "loop.max_minutes: expected float, got 'abc'"),
    (["quickstart", "-o", "loop.max_minute=5"], "did you mean loop.max_minutes?"),
    (["quickstart", "-o", "grpoo.lr=1e-5"], "did you mean grpo?"),
    (["quickstart", "-o", "grpo.loss=drgrpo"],
     "grpo.loss must be one of cispo, dr_grpo, grpo; got 'drgrpo' (did you mean dr_grpo?)"),
    (["quickstart", "-o", "grpo.std_norm=alwys"], "grpo.std_norm must be one of always, never, unless_equal"),
    (["quickstart", "-o", "grpo.experimental.objective.kl_estimator=k2"],
     "grpo.experimental.objective.kl_estimator must be one of k1, k3"),
    (["quickstart", "-o", "grpo.lr=nan"], "grpo.lr: expected a finite number, got 'nan'"),
    (["quickstart", "-o", "grpo.experimental.mini_batches=0"],
     "grpo.experimental.mini_batches must be in [1, 100000], got 0"),
    (["quickstart", "-o", "rollout.group_size=0"], "rollout.group_size must be in [1, 4096], got 0"),
    (["quickstart", "-o", "grpo.negative_advantage_scale=0"],
     "did you mean grpo.experimental.credit.negative_advantage_scale?"),
    (["quickstart", "-o", "model.engine=vlm"], "model.engine has unknown engine 'vlm' (did you mean vllm?)"),
    (["quickstart", "-o", "reward.terms=length,lenght"], "reward.terms has unknown reward term 'lenght' (did you mean length?)"),
    (["quickstart", "-o", "rollout.agent.experimental.max_calls_per_turn=0"],
     "rollout.agent.experimental.max_calls_per_turn must be in [1, 100000], got 0"),
    (["quickstart", "-o", "sft.epochs=0"], "sft.epochs must be in [1, 100000], got 0"),
    (["quickstart", "-o", "tasks.experimental.mix=notjson"],
     "tasks.experimental.mix: expected a table written as JSON"),
    (["quickstart", "-c", "DIR"], "is a directory"),
    (["train", "-c", "MISSING", "-o", "x=1"], "does not exist"),
    (["quickstart", "--resume", "--fresh"], "pick one"),
    # task files and task building
    (["tasks", "show", "MISSING"], "does not exist"),
    (["tasks", "show", "EMPTY"], "holds no tasks"),
    (["tasks", "show", "BAD"], "BAD:1"),
    (["tasks", "build", "not a spec!", "--out", "OUT"], "no tasks built"),
    (["tasks", "build", "toolz==1.2.0", "--validate", "orcale", "--out", "OUT"],
     "validate must be one of none, oracle, patch; got 'orcale' (did you mean oracle?)"),
    (["tasks", "build", "toolz==1.2.0", "--out", "DIR"], "--out"),
    (["agent", "oracle", "MISSING"], "does not exist"),
    (["agent", "oracle", "EMPTY"], "holds no tasks"),
    # bench
    (["bench", "run", "--tasks", "MISSING"], "does not exist"),
    (["bench", "run", "--tasks", "EMPTY"], "holds no tasks"),
    (["bench", "run", "--tasks", "EMPTY", "--k", "0"], "--k"),
    (["bench", "run", "--tasks", "EMPTY", "--concurrency", "0"], "--concurrency"),
    (["bench", "compare", "REPORT", "MISSING"], "does not exist"),
    (["bench", "compare", "REPORT", "REPORT"], "is not a bench report"),
    # training from the command line
    (["trainer", "sft", "MISSING", "BAD", "--out", "OUT"], "does not exist"),
    (["trainer", "sft", "DIR", "BAD", "--out", "OUT"], "BAD:1 is not a Trajectory record"),
    (["trainer", "sft", "DIR", "EMPTY", "--out", "OUT"], "holds no trajectories"),
    (["trainer", "sft", "DIR", "BAD", "--out", "OUT", "-o", "lr=0"], "lr must be in (0, 1], got 0.0"),
    (["model", "pretrain", "--steps", "0"], "--steps"),
    (["model", "pretrain", "--lr", "-1"], "--lr"),
    (["model", "serve", "--port", "70000"], "--port"),
    (["model", "serve", "--runs", "DIR"], "no model to serve: no"),
    # weights, rewards, search
    (["weights", "ls", "MISSING"], "no weight store"),
    (["weights", "verify", "MISSING"], "no weight store"),
    (["rewards", "metrics", "MISSING"], "does not exist"),
    (["rewards", "metrics", "BAD"], "BAD:1 is not a Trajectory record"),
    (["rewards", "curve", "-o", "experimental.length.kk=1"], "did you mean experimental.length.k?"),
    (["rewards", "flags", "EMPTY", "BAD"], "BAD:1"),
    (["search", "index", "MISSING"], "is not a directory"),
    (["search", "query", "DIR", "x", "-k", "0"], "-k"),
    (["embed", "eval", "--fusion", "zcore", "--model", "MISSING"], "fusion must be one of"),
    (["embed", "eval", "--model", "MISSING"], "looprl embed train"),
    # feedback, serving, sandboxes
    (["feedback", "ab", "--store", "MISSING"], "does not exist"),
    (["feedback", "promote", "--out", "MISSING", "--version", "1"], "does not exist"),
    (["feedback", "promote", "--out", "DIR", "--version", "1"], "no candidate"),
    (["serve", "--model", "DIR", "--store", "OUT", "--split-b", "2"], "--split-b"),
    (["dashboard", "--run", "MISSING"], "does not exist"),
    (["sandbox", "run", "--base", "DIR", "--timeout", "0", "--", "true"], "--timeout"),
]


@pytest.mark.parametrize("argv,says", CASES, ids=lambda c: " ".join(c) if isinstance(c, list) else None)
def test_bad_input_of_every_command_is_one_line(argv, says, files, tmp_path, monkeypatch):
    monkeypatch.setenv("LOOPRL_HOME", str(tmp_path / "home"))
    argv = [files.get(a, a) for a in argv]
    says = next((says.replace(k, Path(v).name) for k, v in files.items() if k in says), says)
    r = CliRunner().invoke(app, argv)
    assert r.exit_code == 2, (r.exit_code, r.output, r.exception)
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    assert says in lines[0]
    assert not Path(files["OUT"]).exists()  # nothing written


def test_a_partly_failed_command_exits_nonzero(tmp_path, monkeypatch):
    monkeypatch.setenv("LOOPRL_HOME", str(tmp_path / "home"))
    r = CliRunner().invoke(app, ["tasks", "fetch", "not a spec!"])
    assert r.exit_code == 1 and "not a spec!: rejected: bad package spec" in r.stderr


def test_model_serve_fails_on_a_busy_port_before_any_banner(files, tmp_path):
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        r = CliRunner().invoke(app, ["model", "serve", files["DIR"], "--port", str(port)])
    assert r.exit_code == 2 and "cannot listen on 127.0.0.1:" in r.stderr
    assert "model server on" not in r.stdout


def test_model_serve_without_a_model_finds_the_newest_trained_one(tmp_path):
    from looprl.commands.model import _trained_model

    for name in ("old", "new"):
        (tmp_path / name / "model_rl").mkdir(parents=True)
        os.utime(tmp_path / name / "model_rl", (1e9 + len(name), 1e9 + len(name)))
    os.utime(tmp_path / "old" / "model_rl", (1e9, 1e9))
    (tmp_path / "not_a_run").mkdir()
    assert _trained_model(tmp_path) == tmp_path / "new" / "model_rl"


def test_help_shows_flags_without_a_value_and_no_rst():
    root = CliRunner().invoke(app, ["--help"], terminal_width=200).output
    assert "--debug" in root and "<bool>" not in root
    train = CliRunner().invoke(app, ["train", "--help"], terminal_width=200).output
    assert "--resume" in train and "<bool>" not in train and "<path>" in train  # values keep theirs
    for name, _, _ in SUBCOMMANDS:
        out = CliRunner().invoke(app, [name, "--help"], terminal_width=200).output
        assert "``" not in out, name


def test_a_run_that_failed_its_input_checks_can_be_run_again_without_fresh(tmp_path):
    args = ("train", "-c", str(Path(__file__).parents[1] / "configs" / "train_cpu.toml"), "-o",
            f"tasks.train_file={tmp_path / 'nope.jsonl'}", "--runs", str(tmp_path / "runs"))
    for _ in range(2):  # the second is the same error, not "holds an earlier run"
        r = looprl(*args)
        assert r.returncode == 2 and "nope.jsonl not found" in r.stderr, r.stderr
    state = json.loads((tmp_path / "runs" / "train_cpu" / "state.json").read_text())
    assert state["status"] == "failed" and state["stage"] == "tasks"


def test_a_rollout_server_that_cannot_serve_is_one_line_before_the_run(tmp_path):
    # model.engine=openai rolls out on a server the run does not start: nothing listening, or a
    # base_url that is not its API root (404 on /models), must stop the run at once, not end in a
    # run whose every rollout failed as an infrastructure error after SFT
    import http.server
    import socket
    import threading

    class NotFound(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(404)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), NotFound)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        idle = s.getsockname()[1]
    smoke = str(Path(__file__).parents[1] / "configs" / "smoke.toml")
    try:
        for base_url, needles in [(f"http://127.0.0.1:{server.server_port}", ("answered 404", "/v1")),
                                  (f"http://127.0.0.1:{idle}/v1", ("unreachable", "model serve"))]:
            r = looprl("train", "-c", smoke, "--runs", str(tmp_path), "-o", "model.engine=openai",
                       "-o", f"model.engine_options.base_url={base_url}")
            _one_error_line(r, "model.engine_options.base_url", *needles)
            assert not list(tmp_path.glob("*/")), "a server that cannot serve must not claim a run"
    finally:
        server.shutdown()


def test_model_upcycle_saves_a_moe_of_a_runs_model_and_refuses_a_non_llama_in_one_line(tmp_path):
    from looprl.config import save_config
    from looprl.models.loading import load_model
    from looprl.models.tiny import init_default_model
    from looprl.train import TrainConfig

    run = tmp_path / "runs" / "mine"  # a run directory: its config.json is the run's, not a model's
    init_default_model(run / "model_start", size="tiny", corpus_chars=200_000)
    save_config(TrainConfig(), run / "config.json")
    r = looprl("model", "upcycle", str(run), str(tmp_path / "moe"), "--experts", "4", "--top-k", "2")
    assert r.returncode == 0, r.stderr
    assert f"saved a Mixtral of {run / 'model_start'}: 4 experts, top-2" in " ".join(r.stdout.split())
    moe = load_model(tmp_path / "moe")
    assert moe.model.config.model_type == "mixtral" and moe.model.config.num_local_experts == 4
    _one_error_line(looprl("model", "upcycle", str(tmp_path / "moe"), str(tmp_path / "moe2")),
                    "upcycle takes a Llama without biases", "MixtralForCausalLM")
    _one_error_line(looprl("model", "upcycle", str(tmp_path / "nothing"), str(tmp_path / "m3")),
                    "no model")
