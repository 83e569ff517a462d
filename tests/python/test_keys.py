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


def test_tokens_that_are_not_a_sequence_are_type_errors():
    for bad in (None, "abc", b"ab", 5, np.int64(5), {1: 2}, object()):
        with pytest.raises(TypeError, match="a list, a tuple, a NumPy array") as raised:
            kvtier.chain_block_keys("m", bad, 16)
        assert not isinstance(raised.value, kvtier.Error)
        assert type(bad).__name__ in str(raised.value)
    with pytest.raises(TypeError, match=r"tokens\[1\] is a NoneType"):
        kvtier.chain_block_keys("m", [1, None], 16)
    with pytest.raises(TypeError, match=r"tokens\[0\] is a float"):
        kvtier.chain_block_keys("m", (1.0, 2), 16)
    with pytest.raises(TypeError, match=r"tokens\[2\] is a bool"):
        kvtier.chain_block_keys("m", [1, 2, True], 16)


def test_out_of_range_tokens_report_their_real_value():
    cases = [
        (np.array([2**63, 1], dtype=np.uint64), r"tokens\[0\] is 9223372036854775808;"),
        (np.array([1, 2**64 - 1], dtype=np.uint64), r"tokens\[1\] is 18446744073709551615;"),
        (np.array([7, -3], dtype=np.int8), r"tokens\[1\] is -3;"),
        ([5, 2**63], r"tokens\[1\] is 9223372036854775808;"),
        ([2**64], r"tokens\[0\] is 18446744073709551616;"),
        ([-1, 2**63], r"tokens\[0\] is -1;"),
        ([3, 2**70], r"tokens\[1\] is 1180591620717411303424;"),
        (np.array([1, 2**70], dtype=object), r"tokens\[1\] is 1180591620717411303424;"),
    ]
    for tokens, message in cases:
        with pytest.raises(kvtier.InvalidArgumentError, match=message + r" token ids are in"):
            kvtier.chain_block_keys("m", tokens, 16)
    # In range, every spelling gives the same keys.
    ids = [0, 2**32 - 1] + list(range(30))
    keys = kvtier.chain_block_keys("m", ids, 16)
    assert len(keys) == 2
    for same in (tuple(ids), np.array(ids, dtype=np.uint64), np.array(ids, dtype=np.int64),
                 np.array(ids, dtype=object), [np.uint32(t) for t in ids]):
        assert kvtier.chain_block_keys("m", same, 16) == keys


def test_a_bad_pickled_block_key_is_a_type_or_value_error():
    key = kvtier.BlockKey(1, 2)
    assert pickle.loads(pickle.dumps(key)) == key
    cases = [((1, 2, 3), TypeError, r"\(lo, hi\).*got a tuple of 3"),
             (("a", 1), TypeError, "lo is a str"),
             ((1, 2.5), TypeError, "hi is a float"),
             ((-1, 1), ValueError, r"lo is -1, not in \[0, 2\^64\)"),
             ((1, 2**64), ValueError, r"hi is 18446744073709551616, not in \[0, 2\^64\)")]
    for state, error, message in cases:
        blank = kvtier.BlockKey.__new__(kvtier.BlockKey)
        with pytest.raises(error, match=message):
            blank.__setstate__(state)
    blank = kvtier.BlockKey.__new__(kvtier.BlockKey)
    blank.__setstate__((1, 2**64 - 1))
    assert blank == kvtier.BlockKey(1, 2**64 - 1)
