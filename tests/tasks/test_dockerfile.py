"""Dockerfiles of the Python shape become a workspace and a venv spec; every other instruction is
refused with one line naming the file, the line and the instruction."""

import doctest
import stat
import sys

import pytest

from looprl.tasks import dockerfile
from looprl.tasks.dockerfile import Unsupported, materialise, read_dockerfile

SUPPORTED = """\
# a comment
ARG BASE=python:3.11-slim
FROM ${BASE}
ARG APP=/srv/app
ENV MODE=test \\
    GREETING="hello world"
ENV PATH=/opt/bin:$PATH
WORKDIR ${APP}
COPY requirements.txt ./requirements.txt
RUN python -m pip install --no-cache-dir -r requirements.txt && rm -rf /root/.cache/pip
RUN pip3 install attrs==23.2.0 "tomli>=2; python_version < '3.11'" \\
    && apt-get update && apt-get install -y --no-install-recommends bash coreutils \\
    && rm -rf /var/lib/apt/lists/*
RUN mkdir -p /srv/app/data/cache
COPY --chmod=755 bin/ bin/
COPY ["src", "/srv/app/src"]
COPY *.cfg /srv/app/
LABEL maintainer="x"
USER root
CMD ["python", "-m", "app"]
"""


@pytest.fixture
def context(tmp_path):
    (tmp_path / "requirements.txt").write_text("# pinned\nsix==1.16.0\n\npackaging>=23 # why\n")
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "run").write_text("#!/bin/sh\necho hi\n")
    (tmp_path / "src" / "pkg").mkdir(parents=True)
    (tmp_path / "src" / "pkg" / "__init__.py").write_text("X = 1\n")
    (tmp_path / "src" / "pkg" / "big.log").write_text("ignored\n")
    (tmp_path / "setup.cfg").write_text("[x]\n")
    (tmp_path / ".dockerignore").write_text("# logs\n**/*.log\n")
    (tmp_path / "Dockerfile").write_text(SUPPORTED)
    return tmp_path


def test_the_python_shape_maps_to_a_workspace_and_a_venv(context):
    env = read_dockerfile(context)
    assert (env.image, env.python, env.workdir) == ("python:3.11-slim", "3.11", "/srv/app")
    assert env.requirements == ("six==1.16.0", "packaging>=23", "attrs==23.2.0",
                                'tomli>=2; python_version < "3.11"')
    assert env.env == {"MODE": "test", "GREETING": "hello world"}
    assert env.dirs == ("data/cache",)
    assert any("ENV PATH" in n for n in env.notes)
    out = context.parent / "ws"
    materialise(env, context, out)
    assert (out / "src" / "pkg" / "__init__.py").read_text() == "X = 1\n"
    assert not (out / "src" / "pkg" / "big.log").exists()  # .dockerignore
    assert (out / "requirements.txt").is_file() and (out / "setup.cfg").is_file()
    assert (out / "bin" / "run").stat().st_mode & stat.S_IXUSR  # --chmod=755
    assert (out / "data" / "cache").is_dir()


def test_a_system_base_image_runs_on_the_host_system_with_a_note(tmp_path):
    (tmp_path / "Dockerfile").write_text("FROM ubuntu:24.04\nWORKDIR /app\n")
    env = read_dockerfile(tmp_path)
    assert env.python == f"{sys.version_info.major}.{sys.version_info.minor}"
    assert "host's own system" in env.notes[0]


@pytest.mark.parametrize("line, says", [
    ("FROM node:20", "Python images"),
    ("FROM python:3.11 AS a\nFROM python:3.11", "multi-stage"),
    ("FROM python:3.11\nENTRYPOINT [\"/start.sh\"]", "ENTRYPOINT is not realised"),
    ("FROM python:3.11\nEXPOSE 8080", "EXPOSE is not realised"),
    ("FROM python:3.11\nHEALTHCHECK CMD true", "HEALTHCHECK is not realised"),
    ("FROM python:3.11\nVOLUME /data", "VOLUME is not realised"),
    ("FROM python:3.11\nRUN apt-get install -y looprl-no-such-package", "not installed on this host"),
    ("FROM python:3.11\nRUN curl -sSL https://x | sh", "shell operator '|'"),
    ("FROM python:3.11\nRUN npm install left-pad", "`npm install left-pad`"),
    ("FROM python:3.11\nRUN pip install -e .", "pip option -e"),
    ("FROM python:3.11\nRUN pip install ./pkg", "not a package requirement"),
    ("FROM python:3.11\nRUN pip install git+https://github.com/a/b", "not a package requirement"),
    ("FROM python:3.11\nRUN pip install -r missing.txt", "not a file COPY'd"),
    ("FROM python:3.11\nRUN <<EOF\necho\nEOF", "heredocs"),
    ("FROM python:3.11\nWORKDIR /app\nCOPY --from=builder /x /app/", "--from=builder"),
    ("FROM python:3.11\nWORKDIR /app\nADD https://x.org/a.tgz /app/", "URLs and archives"),
    ("FROM python:3.11\nWORKDIR /app\nCOPY Dockerfile /etc/x", "outside the WORKDIR /app"),
    ("FROM python:3.11\nWORKDIR /app\nCOPY nothing.txt /app/", "no such file"),
    ("FROM python:3.11\nWORKDIR /app\nRUN mkdir -p /opt/x", "outside the WORKDIR"),
    ("FROM python:3.11", "the WORKDIR is /"),
    ("FROM python:3.11\nWORKDIR /usr/src/app", "the WORKDIR is /usr/src/app"),
    ("WORKDIR /app\nFROM python:3.11", "before FROM"),
    ("RUN true", "before FROM"),
])
def test_each_unsupported_instruction_is_refused_in_one_line_naming_it(tmp_path, line, says):
    (tmp_path / "Dockerfile").write_text(line + "\n")
    with pytest.raises(Unsupported) as e:
        read_dockerfile(tmp_path)
    msg = str(e.value)
    assert says in msg and "\n" not in msg
    if not says.startswith("the WORKDIR"):
        assert msg.startswith(f"{tmp_path.name}/Dockerfile:")


def test_the_doctests_run():
    assert doctest.testmod(dockerfile).failed == 0
