"""The Python module end to end: steps whose K/V go into HBM frames through NumPy without copies,
reuse of a closed prompt, pages that travel down to host and NVMe and back, a restart that finds
the prefix on NVMe, pins, hints and the counters."""

import gc

import numpy as np
import pytest

import kvtier
from conftest import config_yaml, make_tokens, open_runtime, run_step


def test_frames_are_the_hbm_arena_without_copies(tmp_path):
    with open_runtime(config_yaml(tmp_path)) as rt:
        g = rt.geometry
        assert (g.layers, g.kv_heads, g.head_dim, g.dtype, g.page_tokens) == (4, 2, 16, "f32", 16)
        assert g.page_bytes == 2 * 16 * 2 * 16 * 4
        view = rt.hbm_view()
        assert not view.on_device
        frames = rt.hbm_frames()
        assert frames.shape == (view.frames, 2, 16, 2, 16)
        assert frames.dtype == np.float32
        assert frames.__array_interface__["data"][0] == view.base
        assert frames.strides[0] == view.frame_stride
        raw = rt.hbm_frames(raw=True)
        assert raw.shape == (view.frames, g.page_bytes)
        # One memory: a write through one array is seen through the other.
        frames[3, 1, 2, 1, 5] = 1.5
        offset = ((1 * 16 + 2) * 2 + 1) * 16 + 5
        assert raw[3, offset * 4:(offset + 1) * 4].view(np.float32)[0] == 1.5
        del frames, raw


def test_step_cycle_and_reuse_bit_for_bit(tmp_path):
    with open_runtime(config_yaml(tmp_path)) as rt:
        tokens = make_tokens(6 * 16, seed=1)
        keys = rt.block_keys(tokens)
        assert len(keys) == 6
        seq = rt.open_sequence(keys)
        assert seq.reused_blocks == 0 and seq.prompt_blocks == 6
        assert run_step(rt, seq.id, tokens, 0, len(tokens)) == []
        rt.close_sequence(seq.id)

        match = rt.match(keys)
        assert match.blocks == 6
        assert sum(match.by_tier.values()) == 6
        seq = rt.open_sequence(keys)
        assert seq.reused_blocks == 6 and seq.reused_tokens == 96
        # Decode one token after the reused prompt: every reused byte is checked on the way.
        more = np.append(tokens, 7)
        assert run_step(rt, seq.id, more, 96, 1) == []
        rt.close_sequence(seq.id)

        stats = rt.stats()
        assert sum(stats["hit_tokens"].values()) >= 96
        assert stats["open_sequences"] == 0
        for tier in kvtier.TIERS:
            assert stats["used_bytes"][tier] <= stats["capacity_bytes"][tier]


def test_pages_survive_host_nvme_and_a_restart(tmp_path):
    text = config_yaml(tmp_path)  # 64 HBM frames, 256 host frames
    prompts = [make_tokens(6 * 16, seed=10 + p, shared=32) for p in range(14)]
    with open_runtime(text) as rt:
        for tokens in prompts:
            seq = rt.open_sequence(rt.block_keys(tokens))
            reused = seq.reused_tokens
            assert run_step(rt, seq.id, tokens, reused, len(tokens) - reused) == []
            rt.close_sequence(seq.id)
        assert rt.stats()["demotions"]["host"] > 0, "HBM never overflowed into host"
        for tokens in prompts:
            seq = rt.open_sequence(rt.block_keys(tokens))
            reused = seq.reused_tokens
            assert reused > 0
            assert run_step(rt, seq.id, tokens, reused, len(tokens) - reused) == [], \
                "a reused page differs from what was written"
            rt.close_sequence(seq.id)
        stats = rt.stats()
        assert stats["failed_loads"] == 0 and stats["checksum_failures"] == 0
        rt.audit()

    with open_runtime(text) as rt:
        assert rt.stats()["nvme_recovered_blocks"] > 0
        tokens = prompts[-1]
        keys = rt.block_keys(tokens)
        match = rt.match(keys)
        assert match.blocks == 6
        assert match.by_tier["nvme"] > 0
        seq = rt.open_sequence(keys)
        assert seq.reused_blocks == 6, "the prefix must be loaded, not recomputed"
        assert run_step(rt, seq.id, np.append(tokens, 3), 96, 1) == []
        rt.close_sequence(seq.id)


def test_pins_hints_and_completions(tmp_path):
    with open_runtime(config_yaml(tmp_path), ["policies.pin_quota=0.5"]) as rt:
        tokens = make_tokens(4 * 16, seed=3)
        keys = rt.block_keys(tokens)
        seq = rt.open_sequence(keys[:2])  # the last two blocks are named at end_step
        frames = rt.hbm_frames()
        with rt.begin_step([(seq.id, len(tokens))]) as step:
            for layer in range(step.layers):
                step.wait_layer(layer)
                step.end_layer(layer)
            step.end({seq.id: keys})
        del frames
        rt.close_sequence(seq.id)
        assert rt.match(keys).blocks == 4

        pin = rt.pin_prefix(keys, ttl_ms=60_000)
        assert rt.stats()["pinned_prefix_blocks"] == 4
        rt.unpin_prefix(pin)
        assert rt.stats()["pinned_prefix_blocks"] == 0

        rt.hint([(1, kvtier.now_ns() + 1_000_000, keys)])
        rt.hint([])
        # The hinted prefix was in HBM already: the hint loaded nothing.
        assert rt.stats()["hinted_loads"] == {"hbm": 0, "host": 0, "nvme": 0}
        assert rt.stats()["hinted_loads_reused"] == {"hbm": 0, "host": 0, "nvme": 0}


def test_the_largest_timeouts_and_ttl_mean_no_timeout(tmp_path):
    """2**63 - 1 ms (the usual "never time out") is a very long wait, not an overflowed negative
    one: calls are taken, the pin holds, shutdown waits for its transfers and succeeds."""
    forever = 2**63 - 1
    rt = open_runtime(config_yaml(tmp_path, nvme=False), ["policies.pin_quota=0.5"],
                      call_timeout_ms=forever, wait_timeout_ms=forever,
                      shutdown_timeout_ms=forever)
    tokens = make_tokens(2 * 16, seed=4)
    keys = rt.block_keys(tokens)
    seq = rt.open_sequence(keys)
    with rt.begin_step([(seq.id, len(tokens))]) as step:
        for layer in range(step.layers):
            step.wait_layer(layer)
            step.end_layer(layer)
        step.end()
    rt.close_sequence(seq.id)
    pin = rt.pin_prefix(keys, ttl_ms=forever)
    assert rt.stats()["pinned_prefix_blocks"] == 2
    with pytest.raises(kvtier.InvalidArgumentError, match="ttl_ms is -1"):
        rt.pin_prefix(keys, ttl_ms=-1)
    rt.unpin_prefix(pin)
    rt.shutdown()


def test_a_dropped_step_is_aborted_and_its_sequence_is_free_again(tmp_path):
    with open_runtime(config_yaml(tmp_path, nvme=False)) as rt:
        seq = rt.open_sequence(rt.block_keys(make_tokens(32, seed=4)))
        step = rt.begin_step([(seq.id, 32)])
        del step
        gc.collect()
        again = rt.begin_step([(seq.id, 32)])  # FailedPreconditionError if still in a step
        again.abort()
        # An exception inside `with` aborts the step.
        try:
            with rt.begin_step([(seq.id, 32)]):
                raise KeyboardInterrupt
        except KeyboardInterrupt:
            pass
        rt.begin_step([(seq.id, 32)]).abort()
        rt.close_sequence(seq.id)
        stats = rt.stats()
        assert stats["used_bytes"]["hbm"] == 0, "pages of aborted steps leaked"
        assert stats["open_sequences"] == 0
