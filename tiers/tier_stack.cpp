#include "tiers/tier_stack.hpp"

namespace kvtier {

Result<std::unique_ptr<TierStack>> open_tiers(const TiersConfig& config, const Geometry& geometry,
                                              TierStackOptions options) {
  auto stack = std::make_unique<TierStack>();
  if (options.device) {
    stack->device = std::move(options.device);
  } else {
    KVTIER_ASSIGN_OR_RETURN(stack->device, select_hbm_device(config.hbm));
  }
  stack->stats = std::make_shared<TransferStats>();
  KVTIER_ASSIGN_OR_RETURN(stack->notifier, CompletionNotifier::create());
  KVTIER_ASSIGN_OR_RETURN(stack->hbm,
                          HbmArena::create(config.hbm, geometry, stack->device, options.memory));
  const PageFormat host_format = config.host_page_format(geometry);
  KVTIER_ASSIGN_OR_RETURN(
      stack->host, HostPool::create(config.host, host_format, stack->device, options.memory));
  if (stack->device && host_format.encodes() && stack->host->frame_count() > 0 &&
      stack->host->backend() != "cuda_pinned") {
    // The codec kernels read and write host frames through their device mapping, which only
    // cudaHostAlloc'd memory has; a pool that fell back to plain pages cannot hold fp8.
    return failed_precondition(
        "tiers.host.kv_dtype: fp8_e4m3 needs the host pool pinned by the GPU driver, but it fell "
        "back to " +
        std::string(stack->host->backend()) +
        " memory (cudaHostAlloc refused); lower tiers.host.capacity or set tiers.host.kv_dtype: "
        "model");
  }
  if (config.nvme.enabled) {
    const PageFormat format = config.nvme_page_format(geometry);
    if (host_format.encodes() && !(format == host_format)) {
      return invalid_argument(
          "tiers.nvme.kv_dtype: the host tier holds fp8_e4m3 pages, which NVMe stores as they "
          "are; set tiers.nvme.kv_dtype: fp8_e4m3");
    }
    NvmeStoreOptions nvme;
    nvme.config = config.nvme;
    nvme.backend = options.io;
    nvme.stats = stack->stats;
    nvme.notifier = stack->notifier;
    nvme.use_fixed_buffers = options.use_fixed_buffers;
    if (stack->host->region_bytes() > 0) {
      nvme.fixed_buffers.push_back(iovec{stack->host->base(), stack->host->region_bytes()});
    }
    auto store = NvmeStore::create(format, std::move(nvme));
    if (!store.ok()) return std::move(store).status().with_context("tiers.nvme");
    stack->nvme = std::move(store).value();
    if (format.encodes() && !host_format.encodes()) {
      auto codec = ConvertingStore::create(*stack->nvme, format);
      if (!codec.ok()) return std::move(codec).status().with_context("tiers.nvme.kv_dtype");
      stack->nvme_codec = std::move(codec).value();
    }
  }
  TransferEngineOptions engine;
  engine.link_gbps = config.hbm.link_gbps;
  engine.stats = stack->stats;
  engine.notifier = stack->notifier;
  KVTIER_ASSIGN_OR_RETURN(
      stack->engine,
      TransferEngine::create(*stack->hbm, *stack->host, stack->nvme_io(), std::move(engine)));
  return stack;
}

}  // namespace kvtier
