"""`pip install .` from the repository builds and installs the module into a fresh virtual
environment, where `import kvtier` finds the installed copy and works (slow: it rebuilds the
project; it also needs the package index for the build requirements)."""

import os
import subprocess
import sys

import pytest


@pytest.mark.slow
def test_pip_install_from_the_repository(tmp_path):
    source = os.environ.get("KVTIER_SOURCE_DIR")
    if not source:
        pytest.skip("KVTIER_SOURCE_DIR is not set (ctest sets it)")
    venv = tmp_path / "venv"
    # System site-packages: numpy comes from Debian, not from the index.
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    subprocess.run([python, "-m", "pip", "install", "--quiet", source,
                    "--config-settings=cmake.define.KVTIER_CUDA=OFF"],
                   check=True, env=env, cwd=tmp_path)
    script = ("import kvtier, numpy; "
              "k = kvtier.chain_block_keys('m', numpy.arange(32), 16); "
              "print(kvtier.__file__); print(kvtier.__version__, len(k))")
    out = subprocess.run([python, "-c", script], check=True, env=env, cwd=tmp_path,
                         capture_output=True, text=True)
    location, summary = out.stdout.strip().splitlines()
    assert location.startswith(str(venv)), f"imported {location}, not the installed module"
    assert summary.endswith(" 2")
