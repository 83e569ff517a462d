"""Block keys from Python: equal to the runtime's, deterministic, hashable, picklable; tokens from
lists, NumPy arrays of any integer type; bad tokens are refused; torch is never imported."""

import pickle
import subprocess
import sys

import numpy as np
import pytest

import kvtier
from conftest import config_yaml, open_runtime


def test_keys_are_chained_deterministic_values():
    tokens = list(range(40))
    keys = kvtier.chain_block_keys("model-a", tokens, 16)
    assert len(keys) == 2  # the partial third block has no key
    assert keys == kvtier.chain_block_keys("model-a", np.arange(40, dtype=np.uint32), 16)
    assert keys == kvtier.chain_block_keys("model-a", np.arange(40, dtype=np.int16), 16)
    assert keys[0] != keys[1]
    assert keys != kvtier.chain_block_keys("model-b", tokens, 16)
    assert all(k.namespace_tag == kvtier.namespace_tag("model-a") for k in keys)
    assert not keys[0].is_private
    assert kvtier.BlockKey.from_hex(str(keys[0])) == keys[0]
    assert eval(repr(keys[1]), {"kvtier": kvtier}) == keys[1]
    assert pickle.loads(pickle.dumps(keys)) == keys
    assert len({keys[0], keys[1], kvtier.BlockKey(keys[0].lo, keys[0].hi)}) == 2
    # The same keys in another process (no random seeds anywhere).
    script = ("import kvtier; print(str(kvtier.chain_block_keys('model-a', list(range(40)), 16)[1]))")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str(keys[1])


def test_runtime_keys_match_the_free_functions(tmp_path):
    with open_runtime(config_yaml(tmp_path, nvme=False, name="keys-model")) as rt:
        tokens = np.arange(64)
        keys = rt.block_keys(tokens)
        assert rt.key_namespace == "keys-model"
        assert keys == kvtier.chain_block_keys("keys-model", tokens, 16)
        assert rt.namespace_root == kvtier.namespace_root("keys-model")
        assert rt.block_key(rt.namespace_root, tokens[:16]) == keys[0]
        assert rt.block_key(keys[0], tokens[16:32]) == keys[1]
        with pytest.raises(kvtier.InvalidArgumentError, match="a block holds 16 tokens, got 3"):
            rt.block_key(keys[0], [1, 2, 3])


def test_bad_tokens_are_refused():
    with pytest.raises(kvtier.InvalidArgumentError, match=r"tokens\[1\] is -5"):
        kvtier.chain_block_keys("m", [1, -5, 3], 16)
    with pytest.raises(kvtier.InvalidArgumentError, match=r"\[0, 2\^32\)"):
        kvtier.chain_block_keys("m", [2**32], 16)
    with pytest.raises(TypeError, match="integers"):
        kvtier.chain_block_keys("m", [1.5, 2.0], 16)
    with pytest.raises(kvtier.InvalidArgumentError, match="one-dimensional"):
        kvtier.chain_block_keys("m", np.zeros((2, 16), dtype=np.int32), 16)
    with pytest.raises(kvtier.InvalidArgumentError, match="block_tokens is 0"):
        kvtier.chain_block_keys("m", [1, 2], 0)
    assert kvtier.chain_block_keys("m", [], 16) == []
    with pytest.raises(kvtier.InvalidArgumentError):
        kvtier.BlockKey.from_hex("xyz")


def test_torch_is_never_imported():
    script = ("import sys, kvtier, numpy; "
              "kvtier.chain_block_keys('m', numpy.arange(32), 16); "
              "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_version_is_the_projects():
    import os
    import re
    source = os.environ.get("KVTIER_SOURCE_DIR")
    if not source:
        pytest.skip("KVTIER_SOURCE_DIR is not set (ctest sets it)")
    header = open(os.path.join(source, "include/kvtier/version.h")).read()
    parts = [re.search(rf"#define KVT_VERSION_{p} (\d+)", header).group(1)
             for p in ("MAJOR", "MINOR", "PATCH")]
    assert kvtier.__version__ == ".".join(parts) == kvtier.version()
    pyproject = open(os.path.join(source, "pyproject.toml")).read()
    assert re.search(r'^version = "([^"]+)"', pyproject, re.M).group(1) == kvtier.__version__
