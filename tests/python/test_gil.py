"""The GIL is released while a call waits: another Python thread runs while one thread is blocked
in wait_layer on a slow load.

The load is made slow on purpose: blocks persisted to NVMe by a first runtime are reopened by a
second one whose HBM<->host link is throttled to 20 KB/s (2 KiB pages: about 0.1 s each), and
whose prefill speed is set so low that loading always beats recomputing. While the main thread
waits for layer 0, a watcher thread asks for layer 0's table: it can only run during the wait if
the GIL was released, and then finds the layer still loading. With the GIL held through the wait,
the watcher would run only after the wait returned, and find the layer ready.

Shutdown on one thread wakes another blocked in wait_layer, and races cleanly with calls."""

import threading
import time

import pytest

import kvtier
from conftest import config_yaml, first_mismatch, make_tokens, open_runtime, run_step


def test_wait_layer_releases_the_gil(tmp_path):
    text = config_yaml(tmp_path, layers=2, kv_heads=1, head_dim=16)  # 2 KiB pages
    tokens = make_tokens(4 * 16, seed=8)
    with open_runtime(text) as rt:
        seq = rt.open_sequence(rt.block_keys(tokens))
        assert run_step(rt, seq.id, tokens, 0, len(tokens)) == []
        rt.close_sequence(seq.id)

    slow = ["tiers.hbm.link_gbps=0.00002", "policies.prefill_tokens_per_s=0.001"]
    with open_runtime(text, slow) as rt:
        seq = rt.open_sequence(rt.block_keys(tokens))
        assert seq.reused_blocks == 4 and seq.reused_by_tier["nvme"] == 4
        frames = rt.hbm_frames()
        step = rt.begin_step([(seq.id, 1)])
        waiting = threading.Event()
        observed = []

        def watcher():
            waiting.wait()
            try:
                step.layer_table(0)
                observed.append("ready")
            except kvtier.FailedPreconditionError:
                observed.append("still loading")

        thread = threading.Thread(target=watcher)
        thread.start()
        waiting.set()
        step.wait_layer(0)
        thread.join()
        assert observed == ["still loading"], "the watcher could not run during wait_layer"
        step.wait_layer(1)
        # The slow load delivered the bytes that were written before the restart.
        for layer in range(2):
            table = step.layer_table(layer)
            assert first_mismatch(frames, rt.geometry, table, 0, layer, tokens, 64) == -1
            step.end_layer(layer)
        step.end()
        del frames
        rt.close_sequence(seq.id)
        assert rt.stats()["stall_nanos"] > 0


def test_calls_racing_a_shutdown_fail_cleanly(tmp_path):
    rt = open_runtime(config_yaml(tmp_path, nvme=False))
    done = []
    errors = []
    started = threading.Semaphore(0)

    def racer():
        calls = 0
        while True:
            try:
                rt.stats()
                rt.match([])
                rt.hbm_view()
            except kvtier.FailedPreconditionError:
                done.append(calls)
                return
            except Exception as e:  # anything else is a failure
                errors.append(e)
                return
            calls += 1
            if calls == 50:
                started.release()

    threads = [threading.Thread(target=racer) for _ in range(4)]
    for t in threads:
        t.start()
    for _ in threads:
        started.acquire()  # every racer is in its loop
    rt.shutdown()  # must not starve behind the racers' calls
    for t in threads:
        t.join()
    assert errors == []
    assert len(done) == 4


def test_shutdown_wakes_a_thread_blocked_in_wait_layer(tmp_path):
    """A thread blocked in wait_layer on a layer that cannot become ready (the last layer of a
    windowed step is not planned until the layers before it end) is woken by shutdown() with
    CancelledError, long before its 60 s wait_timeout_ms; the shutdown does not wait for it."""
    rt = open_runtime(config_yaml(tmp_path, nvme=False), wait_timeout_ms=60_000)
    tokens = make_tokens(40 * 16, seed=9)  # 40 of the 64 HBM frames per layer: one layer at a time
    seq = rt.open_sequence(rt.block_keys(tokens))
    step = rt.begin_step([(seq.id, len(tokens))])
    assert step.windowed
    outcome = []

    def waiter():
        try:
            step.wait_layer(step.layers - 1)
            outcome.append("ready")
        except Exception as e:  # the kind is checked below
            outcome.append(e)

    thread = threading.Thread(target=waiter)
    thread.start()
    time.sleep(0.2)  # let it block (were it late, it would see FailedPreconditionError instead)
    start = time.monotonic()
    rt.shutdown()
    thread.join(timeout=90)
    elapsed = time.monotonic() - start
    assert not thread.is_alive()
    assert len(outcome) == 1
    assert isinstance(outcome[0], (kvtier.CancelledError, kvtier.FailedPreconditionError)), \
        f"the blocked wait ended with {outcome[0]!r}, not a shut-down error"
    if isinstance(outcome[0], kvtier.CancelledError):
        assert "shutting down" in str(outcome[0])
    assert elapsed < 20, f"shutdown and the woken wait took {elapsed:.1f} s"
    with pytest.raises(kvtier.FailedPreconditionError, match="shut down"):
        step.wait_layer(0)


def test_a_refused_shutdown_fails_no_call_on_other_threads(tmp_path):
    """Shutdowns refused while other threads make calls and NumPy views of the arena leave the
    runtime open and fail no call: a call that arrives while a shutdown decides waits for the
    decision (the order itself is tested deterministically in tests/runtime/call_gate_test.cpp;
    here the module races it for real). A call may fail only once a shutdown went through: when
    one fails, as many shutdowns were refused as in the end."""
    rt = open_runtime(config_yaml(tmp_path, nvme=False))
    stop = threading.Event()
    refusals = [0]
    failed_after = []  # refusals so far when a call failed as shut down
    others = []

    def racer(call):
        while not stop.is_set():
            try:
                call()
            except kvtier.FailedPreconditionError:
                failed_after.append(refusals[0])
                return
            except Exception as e:  # anything else is a failure
                others.append(e)
                return

    def make_view():
        frames = rt.hbm_frames()
        del frames

    threads = [threading.Thread(target=racer, args=(c,))
               for c in (make_view, make_view, rt.stats, rt.stats)]
    for t in threads:
        t.start()
    # The first shutdown is refused whatever the racers do (on a loaded machine they may not have
    # made a view yet): this thread holds one.
    held = rt.hbm_frames()
    with pytest.raises(BufferError):
        rt.shutdown()
    refusals[0] += 1
    del held
    deadline = time.monotonic() + 3
    shut = False
    while time.monotonic() < deadline and not shut:
        try:
            rt.shutdown()
            shut = True
        except BufferError:
            refusals[0] += 1
    stop.set()
    for t in threads:
        t.join()
    assert others == []
    spurious = [n for n in failed_after if n != refusals[0]]
    assert spurious == [], (f"calls failed as shut down during refused shutdowns (after "
                            f"{spurious} of {refusals[0]} refusals)")
    assert rt.closed == shut
    rt.shutdown()
    assert rt.closed
