"""Plugins found by name: built-ins, then entry points, then module:attr; a wrong name is a
one-line ConfigError naming the choices and the nearest."""

import doctest
import subprocess
import sys

import pytest

from looprl import plugins
from looprl.errors import ConfigError
from looprl.plugins import find


def test_the_doctest_runs():
    res = doctest.testmod(plugins)
    assert res.attempted > 0 and res.failed == 0


def test_a_builtin_wins_and_module_attr_imports():
    marker = object()
    assert find("tools", "json:dumps", {"json:dumps": marker}) is marker
    assert find("loggers", "os.path:join", {}).__name__ == "join"


def test_failures_name_the_plugin_and_how_to_fix():
    with pytest.raises(ConfigError, match=r"^unknown engine 'vlm' \(did you mean vllm\?\): "
                                          r"choose one of torch, vllm, or name your own"):
        find("engines", "vlm", {"torch": 1, "vllm": 2})
    with pytest.raises(ConfigError, match=r"cannot load task_sources plugin 'json:nope': "
                                          r"AttributeError"):
        find("task_sources", "json:nope", {})
    with pytest.raises(ConfigError, match=r"cannot load signals plugin 'no_such_mod_xyz:f': "
                                          r"ModuleNotFoundError"):
        find("signals", "no_such_mod_xyz:f", {})


def test_the_public_api_imports_light_and_names_resolve():
    code = ("import sys, looprl; assert 'torch' not in sys.modules; "
            "missing = [n for n in looprl.__all__ if not hasattr(looprl, n)]; "
            "assert not missing, missing; from looprl.train import TrainConfig; "
            "assert looprl.TrainConfig is TrainConfig")
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.slow  # imports every package (torch, transformers) in a fresh interpreter
def test_every_packages_lazy_exports_resolve():
    """A module renamed or split must take its package's lazy export table along."""
    pkgs = ["sandbox", "tasks", "harness", "trainer", "serve", "feedback", "search", "rewards",
            "weights", "models", "dashboard"]
    code = (f"import importlib; pkgs = {pkgs!r}; missing = [p + '.' + n for p in pkgs "
            "for m in [importlib.import_module('looprl.' + p)] for n in m.__all__ "
            "if not hasattr(m, n)]; assert not missing, missing")
    subprocess.run([sys.executable, "-c", code], check=True)
