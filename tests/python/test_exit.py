"""The interpreter exits cleanly while a daemon thread is inside a call that released the GIL.

At exit CPython 3.11 ends a thread that re-takes the GIL with pthread_exit, a forced unwind that
aborts the process ("terminate called without an active exception", rc 134) when it meets a
noexcept frame, such as pybind11's gil_scoped_release destructor (pybind11 #2215). Each scenario
exits the main thread while a daemon thread loops on one kind of GIL-releasing call: one that
returns, one that raises (the re-take then happens while the exception unwinds), and a step
dropped unended, which a destructor aborts without the GIL. The exit is a race, so each scenario
runs several times."""

import subprocess
import sys

import pytest

from conftest import config_yaml

SCRIPT = r"""
import sys
import threading

import numpy as np

import kvtier

scenario, config = sys.argv[1], sys.argv[2]
rt = kvtier.Runtime.open_file(config, use_environment=False, wait_timeout_ms=1)
if scenario == "match":
    def call():
        rt.match([])
elif scenario == "wait_layer_times_out":
    tokens = np.arange(40 * 16) % 32000  # 40 of the 64 HBM frames per layer: windowed
    seq = rt.open_sequence(rt.block_keys(tokens))
    step = rt.begin_step([(seq.id, len(tokens))])
    assert step.windowed
    def call():
        try:
            step.wait_layer(step.layers - 1)  # not planned before the layers before it end
        except kvtier.DeadlineExceededError:
            pass
elif scenario == "dropped_step":
    seq = rt.open_sequence(rt.block_keys(np.arange(32)))
    def call():
        rt.begin_step([(seq.id, 32)])  # dropped at once: ~Step aborts it without the GIL
else:
    raise SystemExit(f"unknown scenario {scenario}")

looping = threading.Event()

def loop():
    calls = 0
    while True:
        call()
        calls += 1
        if calls == 20:
            looping.set()

threading.Thread(target=loop, daemon=True).start()
assert looping.wait(60), "the daemon thread did not get going"
print("main thread exits", flush=True)
"""

RUNS = 5


@pytest.mark.parametrize("scenario", ["match", "wait_layer_times_out", "dropped_step"])
def test_exit_with_a_daemon_thread_inside_a_gil_releasing_call(tmp_path, scenario):
    config = tmp_path / "config.yaml"
    config.write_text(config_yaml(tmp_path, nvme=False))
    for run in range(RUNS):
        out = subprocess.run([sys.executable, "-c", SCRIPT, scenario, str(config)],
                             capture_output=True, text=True, timeout=120)
        assert "main thread exits" in out.stdout, f"run {run}: {out.stderr}"
        assert "terminate" not in out.stderr, f"run {run}: {out.stderr}"
        assert out.returncode == 0, f"run {run}: rc {out.returncode}, stderr: {out.stderr}"
