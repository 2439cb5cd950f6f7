import subprocess
import sys

from inventory.models import Item
from inventory.report import low_stock


def test_item_default_reorder_level():
    assert Item("a", 3).reorder_level == 0
    assert not Item("a", 3).is_low()
    assert Item("a", 0).is_low()


def test_is_low_boundary():
    assert Item("a", 10, 10).is_low()
    assert not Item("a", 11, 10).is_low()


def test_low_stock_sorted():
    items = [Item("z", 1, 5), Item("b", 9, 2), Item("a", 2, 2)]
    assert low_stock(items) == ["a", "z"]


def test_cli_low():
    out = subprocess.run([sys.executable, "-m", "inventory.cli", "--low", "/tests/stock.csv"],
                         capture_output=True, text=True, cwd="/app")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["bolts", "screws", "washers"]


def test_cli_total_unchanged():
    out = subprocess.run([sys.executable, "-m", "inventory.cli", "/tests/stock.csv"],
                         capture_output=True, text=True, cwd="/app")
    assert out.stdout.strip() == "65"
