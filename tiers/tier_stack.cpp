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
  KVTIER_ASSIGN_OR_RETURN(stack->host,
                          HostPool::create(config.host, geometry, stack->device, options.memory));
  if (config.nvme.enabled) {
    NvmeStoreOptions nvme;
    nvme.config = config.nvme;
    nvme.backend = options.io;
    nvme.stats = stack->stats;
    nvme.notifier = stack->notifier;
    nvme.use_fixed_buffers = options.use_fixed_buffers;
    if (stack->host->region_bytes() > 0) {
      nvme.fixed_buffers.push_back(iovec{stack->host->base(), stack->host->region_bytes()});
    }
    const PageFormat format = config.nvme_page_format(geometry);
    auto store = NvmeStore::create(format, std::move(nvme));
    if (!store.ok()) return std::move(store).status().with_context("tiers.nvme");
    stack->nvme = std::move(store).value();
    if (format.encodes()) {
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
