import os
import sys

import pytest

sys.path.insert(0, "/app")
from config import ServerConfig  # noqa: E402


@pytest.mark.parametrize("port", [0, -1, 65536, 100000])
def test_bad_ports(port):
    with pytest.raises(ValueError):
        ServerConfig(port=port)


@pytest.mark.parametrize("port", [1, 80, 8080, 65535])
def test_good_ports(port):
    assert ServerConfig(port=port).port == port


def test_defaults_kept():
    c = ServerConfig()
    assert (c.host, c.port, c.workers) == ("localhost", 8080, 1)


def test_verifier_env():
    assert os.environ["CONFIG_STRICT"] == "1"
