// Which blocks of a batch another sequence of the same batch already holds.
//
// Sequences of one batch often share prompt blocks (a system prompt, a document asked about several
// times): a shared block takes one HBM frame per layer however many block tables name it, so what
// a step needs is its distinct blocks. Block keys are chained (a key names its whole prefix), so
// two sequences can share a block only if they share every block before it: what a sequence
// shares with earlier ones is a leading run. shared_prefix_lengths() returns, per sequence, the
// length of that run: blocks [0, n) of sequence i are held by a sequence before it in the batch,
// blocks from n on are not.
//
// How: the batch is partitioned by key depth by depth (a trie walk); a sequence leaves the walk as
// soon as no other sequence of its group has its next key, so only the shared part of each context
// is read, not whole contexts (a decode batch of long contexts that share nothing costs one key
// per sequence). Private keys are never shared. Keys that break the chaining rule make it find less
// sharing than there is (a block counted once per sequence, as if none were shared), never more.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kvtier/block_key.hpp"

namespace kvtier {

std::vector<uint32_t> shared_prefix_lengths(std::span<const std::span<const BlockKey>> contexts);

}  // namespace kvtier
