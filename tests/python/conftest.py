"""Shared helpers for the kvtier Python tests: a small runtime over a store in a temporary
directory, and a stand-in engine that writes deterministic K/V values into the HBM frames it is
given (through NumPy, without copies) and checks them when it reads them back."""

import numpy as np
import pytest

import kvtier


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: rebuilds the project (pip install); opt-in")


def config_yaml(store_dir, *, hbm="256KiB", host="1MiB", nvme=True, layers=4, kv_heads=2,
                head_dim=16, dtype="f32", page_tokens=16, name="py-test"):
    """YAML text for a small runtime: f32 pages of 4 KiB by default, 64 HBM frames."""
    return f"""
model:
  name: {name}
  layers: {layers}
  kv_heads: {kv_heads}
  head_dim: {head_dim}
  dtype: {dtype}
  page_tokens: {page_tokens}
tiers:
  hbm: {{backend: emulated, capacity: {hbm}}}
  host: {{capacity: {host}, huge_pages: false, lock_memory: false}}
  nvme: {{enabled: {str(nvme).lower()}, capacity: 8MiB, paths: ["{store_dir}/store0.kvs"], queue_depth: 16}}
metrics:
  listen: off
"""


def open_runtime(text, overrides=(), **options):
    """Opens a runtime from YAML text, skipping the test where the NVMe store cannot be opened."""
    try:
        return kvtier.Runtime.open_yaml(text, list(overrides), use_environment=False, **options)
    except kvtier.UnavailableError as e:
        pytest.skip(f"the NVMe store cannot be opened here: {e}")


def make_tokens(n, seed, shared=0):
    """n token ids; the first `shared` are the same for every seed (a common prefix)."""
    common = np.random.default_rng(424242).integers(0, 32000, size=shared)
    own = np.random.default_rng(seed).integers(0, 32000, size=n - shared)
    return np.concatenate([common, own]).astype(np.int64)


def kv_values(token, position, layer, value, width):
    """The K (value=0) or V (value=1) of one token of one layer, [kv_heads * head_dim] floats:
    a function of content and position only, so shared prefixes produce identical pages. Small
    integers, exact in float32, so comparisons are bit for bit."""
    base = (int(token) * 31 + int(position) * 7 + layer * 131 + value * 17) % 60000
    return (base + np.arange(width)) % 65536


def write_tokens(frames, geometry, table, item, layer, tokens, first, count):
    """Writes tokens [first, first + count) of batch item `item` into its frames of `layer`."""
    pages = table.frames(item)
    width = geometry.kv_heads * geometry.head_dim
    for pos in range(first, first + count):
        frame = pages[pos // geometry.page_tokens]
        slot = pos % geometry.page_tokens
        for value in (0, 1):
            frames[frame, value, slot] = kv_values(tokens[pos], pos, layer, value, width).reshape(
                geometry.kv_heads, geometry.head_dim)


def first_mismatch(frames, geometry, table, item, layer, tokens, count):
    """The first position in [0, count) whose K or V differs from what write_tokens wrote, or -1."""
    pages = table.frames(item)
    width = geometry.kv_heads * geometry.head_dim
    for pos in range(count):
        frame = pages[pos // geometry.page_tokens]
        slot = pos % geometry.page_tokens
        for value in (0, 1):
            expected = kv_values(tokens[pos], pos, layer, value, width).reshape(
                geometry.kv_heads, geometry.head_dim)
            if not np.array_equal(frames[frame, value, slot], expected):
                return pos
    return -1


def run_step(rt, sequence, tokens, context, new_tokens):
    """One step for one sequence: for each layer, wait, check the context already there, write the
    new tokens, end the layer. Returns the positions that differed (empty when all matched)."""
    frames = rt.hbm_frames()
    geometry = rt.geometry
    bad = []
    with rt.begin_step([(sequence, new_tokens)]) as step:
        assert step.items[0].context_tokens == context
        for layer in range(step.layers):
            step.wait_layer(layer)
            table = step.layer_table(layer)
            mismatch = first_mismatch(frames, geometry, table, 0, layer, tokens, context)
            if mismatch >= 0:
                bad.append((layer, mismatch))
            write_tokens(frames, geometry, table, 0, layer, tokens, context, new_tokens)
            step.end_layer(layer)
    assert step.finished
    del frames
    return bad
