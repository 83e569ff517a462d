"""Bad input through the Python API: each a kvtier.Error subclass (also the matching built-in
exception) with the runtime's message; the process keeps running and nothing leaks."""

import gc

import numpy as np
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
    rt.close_sequence(seq.id, generated_tokens=3)
    with pytest.raises(kvtier.NotFoundError):
        rt.close_sequence(seq.id)  # closed already
    with pytest.raises(kvtier.NotFoundError):
        rt.close_sequence(seq.id, generated_tokens=3)
    with pytest.raises(TypeError):
        rt.close_sequence(seq.id, generated_tokens=-1)
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
    rt.audit()  # the errors above left every invariant intact

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

    for call in (lambda: rt.open_sequence(keys), lambda: rt.match(keys), rt.stats, rt.audit,
                 rt.hbm_frames, rt.hbm_view, lambda: rt.begin_step([(seq.id, 1)]),
                 lambda: step.wait_layer(0)):
        with pytest.raises(kvtier.FailedPreconditionError, match="shut down"):
            call()


def test_layer_table_arrays_are_read_only_and_frames_checks_the_table(tmp_path):
    import ctypes
    with open_runtime(config_yaml(tmp_path, nvme=False)) as rt:
        seq = rt.open_sequence(rt.block_keys(make_tokens(64, seed=7)))
        with rt.begin_step([(seq.id, 64)]) as step:
            step.wait_layer(0)
            table = step.layer_table(0)
            assert list(table.indptr) == [0, 4] and list(table.last_page_len) == [16]
            frames = list(table.frames(0))
            assert frames == list(table.indices) and len(frames) == 4
            for name in ("indptr", "indices", "last_page_len"):
                array = getattr(table, name)
                assert array.dtype == np.int32
                assert not array.flags.writeable, f"LayerTable.{name} is writable"
                with pytest.raises(ValueError, match="read-only"):
                    array[0] = 10**9
                with pytest.raises(ValueError):
                    array.setflags(write=True)  # nor can it be made writable again
                with pytest.raises(ValueError):
                    array[:].setflags(write=True)
            # The arrays keep what they show alive without the table.
            indptr = table.indptr
            del table
            gc.collect()
            assert list(indptr) == [0, 4]
            table = step.layer_table(0)
            # A table whose bytes were changed anyway (ctypes) is refused, never read past.
            indptr_at = table.indptr.__array_interface__["data"][0]
            end = ctypes.c_int32.from_address(indptr_at + 4)
            for bad in (10**9, 6, -1):
                end.value = bad
                with pytest.raises(kvtier.OutOfRangeError, match=r"item 0: indptr names .* has 4 indices"):
                    table.frames(0)
            end.value = 4
            assert list(table.frames(0)) == frames
            with pytest.raises(kvtier.OutOfRangeError, match="item 1 of a batch of 1"):
                table.frames(1)
            for layer in range(step.layers):
                step.wait_layer(layer)
                step.end_layer(layer)
        # The HBM frames stay writable: the engine writes K/V there.
        hbm = rt.hbm_frames()
        assert hbm.flags.writeable and rt.hbm_frames(raw=True).flags.writeable
        del hbm
        gc.collect()
        rt.close_sequence(seq.id)


def test_bad_completions_are_type_errors_naming_the_item(tmp_path):
    with open_runtime(config_yaml(tmp_path, nvme=False)) as rt:
        seq = rt.open_sequence(rt.block_keys(make_tokens(32, seed=8)))
        cases = [({seq.id: "x"}, rf"completions\[{seq.id}\]: expected a list of kvtier\.BlockKey"
                                 r" \(got str\)"),
                 ({seq.id: [1]}, rf"completions\[{seq.id}\]: keys\[0\] must be a kvtier\.BlockKey \(got int\)"),
                 ({"a": []}, r"completions\['a'\]: the sequence id must be an int"),
                 ({-1: []}, r"completions\[-1\]: the sequence id must be an int in \[0, 2\^64\)"),
                 ([1, 2], r"completions\[0\]: expected a \(sequence, \[BlockKey, \.\.\.\]\) pair"
                          r" \(got int\)"),
                 ([(seq.id, [], 1)], r"completions\[0\]: expected a \(sequence, \[BlockKey, \.\.\.\]\)"
                                     r" pair \(got a tuple of 3\)"),
                 (5, r"completions must be a dict \{sequence: \[keys\]\} or a list of "
                     r"\(sequence, keys\) pairs \(got int\)")]
        for completions, message in cases:
            step = rt.begin_step([(seq.id, 32)])
            for layer in range(step.layers):
                step.wait_layer(layer)
                step.end_layer(layer)
            with pytest.raises(TypeError, match=message) as raised:
                step.end(completions)
            assert not isinstance(raised.value, kvtier.Error)
            assert not step.finished
            step.abort()
        rt.close_sequence(seq.id)
