import torch
from typer.testing import CliRunner

from looprl.weights.cli import app
from looprl.weights.store import LocalWeightStore


def test_ls_and_verify_report_a_damaged_version(tmp_path):
    store = LocalWeightStore(tmp_path)
    w = torch.randn(64, 64)
    for v in range(3):
        store.publish({"w": w + v * 1e-3}, v)
    runner = CliRunner()
    out = runner.invoke(app, ["ls", str(tmp_path)])
    assert out.exit_code == 0 and "delta" in out.output and "full" in out.output
    assert runner.invoke(app, ["verify", str(tmp_path)]).exit_code == 0
    blob = tmp_path / "v0000000001" / "data.zst"
    blob.write_bytes(blob.read_bytes()[:-8])
    out = runner.invoke(app, ["verify", str(tmp_path)])
    assert out.exit_code == 1 and "v1:" in out.output and "v2:" in out.output
