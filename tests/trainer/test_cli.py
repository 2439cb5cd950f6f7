import json

from typer.testing import CliRunner

from looprl.commands.trainer import app
from looprl.models.tokenizer import build_tokenizer

from .helpers import segment, tiny_llama, trajectory


def test_sft_command_trains_and_saves(tmp_path):
    model_dir, out = tmp_path / "m", tmp_path / "out"
    tiny_llama(vocab=512).save_pretrained(model_dir)
    build_tokenizer(None).save_pretrained(model_dir)
    data = tmp_path / "trajs.jsonl"
    lines = [trajectory([segment([1, 2, 3], [40 + s, 41, 42, 43])], 1.0).to_json() for s in range(4)]
    data.write_text("\n".join(lines) + "\n")
    res = CliRunner().invoke(app, ["sft", str(model_dir), str(data), "--out", str(out),
                                   "-o", "epochs=3", "-o", "lr=1e-2", "-o", "experimental.progress=false"])
    assert res.exit_code == 0, res.output
    losses = json.loads((out / "sft_losses.json").read_text())
    assert len(losses) == 3 and losses[-1] < losses[0]
    assert (out / "config.json").exists() and (out / "sft_config.json").exists()
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"task_id": "x"}\n')
    res = CliRunner().invoke(app, ["sft", str(model_dir), str(bad), "--out", str(out)])
    assert res.exit_code != 0 and "Trajectory" in str(res.exception)
