import torch
from typer.testing import CliRunner

from looprl.commands.weights import app
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


def test_a_damaged_manifest_is_listed_and_verify_fails(tmp_path):
    store = LocalWeightStore(tmp_path)
    for v in range(2):
        store.publish({"w": torch.randn(8, 8)}, v)
    path = tmp_path / "v0000000001" / "manifest.json"
    path.write_text(path.read_text().replace('"version": 1', '"version": 2'))
    runner = CliRunner()
    out = runner.invoke(app, ["ls", str(tmp_path)])
    assert out.exit_code == 0 and "damaged" in out.output
    out = runner.invoke(app, ["verify", str(tmp_path)])
    assert out.exit_code == 1 and "v0: ok" in out.output and "v1: weight version 1: manifest" in out.output


def test_a_path_that_is_no_store_is_an_error_not_an_empty_table(tmp_path):
    out = CliRunner().invoke(app, ["ls", str(tmp_path / "nope")])
    assert out.exit_code != 0 and "no weight store" in str(out.exception)
    assert not (tmp_path / "nope").exists()
