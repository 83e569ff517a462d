"""Bad input through the Python API: each a kvtier.Error subclass (also the matching built-in
exception) with the runtime's message; the process keeps running and nothing leaks."""

import gc

import pytest

import kvtier
from conftest import config_yaml, make_tokens, open_runtime


def test_the_error_hierarchy():
    assert issubclass(kvtier.InvalidArgumentError, kvtier.Error)
    assert issubclass(kvtier.InvalidArgumentError, ValueError)
    assert issubclass(kvtier.NotFoundError, LookupError)
    assert issubclass(kvtier.OutOfRangeError, IndexError)
    assert issubclass(kvtier.DeadlineExceededError, TimeoutError)
    assert issubclass(kvtier.IoError, OSError)
    assert issubclass(kvtier.FailedPreconditionError, RuntimeError)
    assert kvtier.NotFoundError.code == "not_found"
    assert kvtier.Error.code is None


def test_bad_configurations_name_the_key(tmp_path):
    with pytest.raises(kvtier.InvalidArgumentError, match=r"<yaml text>:3:5: tiers\.host\.capcity"):
        kvtier.Runtime.open_yaml("tiers:\n  host:\n    capcity: 1GiB\n", use_environment=False)
    with pytest.raises(ValueError, match=r"tiers\.host\.capacity=abc"):
        kvtier.Runtime.open_yaml("", ["tiers.host.capacity=abc"], use_environment=False)
    with pytest.raises(kvtier.NotFoundError, match="cannot open"):
        kvtier.Runtime.open_file(str(tmp_path / "missing.yaml"), use_environment=False)
    with pytest.raises(kvtier.InvalidArgumentError, match="wait_timeout_ms is 0"):
        kvtier.Runtime.open_yaml("", wait_timeout_ms=0)
    with pytest.raises(TypeError):
        kvtier.Runtime()


def test_bad_calls_are_errors_and_nothing_leaks(tmp_path):
    rt = open_runtime(config_yaml(tmp_path, nvme=False))
    tokens = make_tokens(32, seed=5)
    keys = rt.block_keys(tokens)

    with pytest.raises(kvtier.NotFoundError, match="12345"):
        rt.close_sequence(12345)
    with pytest.raises(kvtier.NotFoundError):
        rt.begin_step([(777, 1)])

    foreign = kvtier.chain_block_keys("another-model", tokens, 16)
    with pytest.raises(kvtier.InvalidArgumentError, match="another namespace"):
        rt.open_sequence(foreign)
    with pytest.raises(kvtier.InvalidArgumentError, match="another namespace"):
        rt.match(foreign)

    seq = rt.open_sequence(keys)
    with pytest.raises(kvtier.InvalidArgumentError):
        rt.begin_step([(seq.id, 1), (seq.id, 1)])  # the same sequence twice in one batch
    step = rt.begin_step([(seq.id, 32)])
    with pytest.raises(kvtier.FailedPreconditionError):
        rt.begin_step([(seq.id, 1)])  # a sequence already in a step
    with pytest.raises(kvtier.OutOfRangeError, match="layer 99"):
        step.layer_table(99)
    with pytest.raises(IndexError):
        step.wait_layer(99)
    step.abort()
    with pytest.raises(kvtier.NotFoundError):
        step.end()
    rt.close_sequence(seq.id)
    with pytest.raises(kvtier.NotFoundError):
        rt.close_sequence(seq.id)  # closed already
    with pytest.raises(kvtier.NotFoundError):
        rt.begin_step([(seq.id, 1)])

    # A step that cannot fit: one layer needs more than the 64 HBM frames.
    big = rt.open_sequence(rt.block_keys(make_tokens(16 * 80, seed=6)))
    with pytest.raises(kvtier.ResourceExhaustedError):
        rt.begin_step([(big.id, 16 * 80)])
    rt.close_sequence(big.id)

    with pytest.raises(kvtier.InvalidArgumentError, match="ttl_ms"):
        rt.pin_prefix(keys, ttl_ms=0)
    with pytest.raises(kvtier.NotFoundError):
        rt.unpin_prefix(4242)

    stats = rt.stats()
    assert stats["used_bytes"]["hbm"] == 0, "an error leaked HBM frames"
    assert stats["open_sequences"] == 0

    # Shutdown while an array views the arena is refused, as mmap.close() is.
    frames = rt.hbm_frames()
    view = frames[5]  # a slice keeps the same lease
    del frames
    with pytest.raises(BufferError, match="1 NumPy array"):
        rt.shutdown()
    assert not rt.closed
    del view
    gc.collect()
    rt.shutdown()
    assert rt.closed
    rt.shutdown()  # idempotent

    for call in (lambda: rt.open_sequence(keys), lambda: rt.match(keys), rt.stats,
                 rt.hbm_frames, rt.hbm_view, lambda: rt.begin_step([(seq.id, 1)]),
                 lambda: step.wait_layer(0)):
        with pytest.raises(kvtier.FailedPreconditionError, match="shut down"):
            call()
