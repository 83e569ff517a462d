// TierStack: the three tiers and the transfer engine, opened together from TiersConfig.
//
// The one place that knows the order: resolve the HBM backend (GPU or emulated), allocate the HBM
// arena and the host pool (placed near the GPU), open the NVMe store with the host pool registered
// as io_uring fixed buffers, then start the transfer engine — all sharing one TransferStats and one
// completion eventfd. Members are declared so that destruction runs in reverse: the engine stops
// first (its queues drain), then the store (its I/O threads finish), then the memory tiers.
// Page formats: with tiers.host.kv_dtype: fp8_e4m3 the host frames hold fp8 pages (the copy engine
// encodes and decodes on the HBM<->host copies) and the store, which must be fp8 too, takes them as
// they are. With only tiers.nvme.kv_dtype: fp8_e4m3 the store holds fp8 pages and a
// ConvertingStore in front of it quantizes and dequantizes host pages as computed. Either way the
// engine (and whoever moves blocks) goes through nvme_io().
// The seams (device, host memory, I/O backend) can be replaced for tests and benchmarks.
#pragma once

#include <memory>

#include "kvtier/config.hpp"
#include "kvtier/transfer_stats.hpp"
#include "tiers/converting_store.hpp"
#include "tiers/device_api.hpp"
#include "tiers/hbm_arena.hpp"
#include "tiers/host_memory_api.hpp"
#include "tiers/host_pool.hpp"
#include "tiers/io_backend.hpp"
#include "tiers/nvme_store.hpp"
#include "tiers/transfer_engine.hpp"

namespace kvtier {

struct TierStack {
  std::shared_ptr<DeviceApi> device;  // null: HBM is emulated
  std::shared_ptr<TransferStats> stats;
  std::shared_ptr<CompletionNotifier> notifier;
  std::unique_ptr<HbmArena> hbm;
  std::unique_ptr<HostPool> host;
  std::unique_ptr<NvmeStore> nvme;  // null when tiers.nvme.enabled is false
  // Null unless the NVMe tier stores another format than the host tier holds.
  std::unique_ptr<ConvertingStore> nvme_codec;
  std::unique_ptr<TransferEngine> engine;

  // The NVMe tier as host frames see it; null without an NVMe tier.
  BlockStore* nvme_io() const {
    return nvme_codec ? static_cast<BlockStore*>(nvme_codec.get()) : nvme.get();
  }
};

struct TierStackOptions {
  // Use this device instead of resolving tiers.hbm.backend (tests: a fake; null: resolve).
  std::shared_ptr<DeviceApi> device;
  std::shared_ptr<HostMemoryApi> memory = system_host_memory();
  std::shared_ptr<IoBackend> io = posix_io_backend();
  bool use_fixed_buffers = true;
};

Result<std::unique_ptr<TierStack>> open_tiers(const TiersConfig& config, const Geometry& geometry,
                                              TierStackOptions options = {});

}  // namespace kvtier
