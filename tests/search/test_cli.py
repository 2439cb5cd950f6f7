from typer.testing import CliRunner

from looprl.cli import app as looprl
from looprl.commands.search import search_app


def test_search_index_then_query_is_incremental(repo, tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("LOOPRL_HOME", str(tmp_path / "home"))
    r = CliRunner()
    out = r.invoke(search_app, ["index", str(repo), "--model", str(tiny_model_dir)])
    assert out.exit_code == 0, out.output
    assert "embedded 4 files" in out.output
    (repo / "text" / "words.py").write_text("def shout(s):\n    return s.upper()\n")
    out = r.invoke(search_app, ["index", str(repo), "--model", str(tiny_model_dir)])
    assert "embedded 1 files (1 chunks), removed 0" in out.output
    out = r.invoke(search_app, ["query", str(repo), "parse http header", "-k", "1",
                                "--model", str(tiny_model_dir)])
    assert out.exit_code == 0 and out.stdout.strip() == \
        "1. net/http.py:5-8 function parse_http_header"


def test_embed_eval_without_a_model_says_how_to_get_one(tmp_path):
    out = CliRunner().invoke(looprl, ["embed", "eval", "--model", str(tmp_path / "none")])
    assert out.exit_code == 2 and "looprl embed train" in out.stderr
