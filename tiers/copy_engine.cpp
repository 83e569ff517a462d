#include "tiers/copy_engine.hpp"

#include <string>

#include "tiers/page_codec.hpp"

namespace kvtier {

Status refused_pages_status(const CopyJob& job) {
  if (!job.host_format || job.direction != CopyDirection::kHbmToHost) return Status();
  std::string frames;
  uint32_t refused = 0;
  for (std::size_t i = 0; i < job.segments.size(); ++i) {
    if (!encoded_page_refused(*job.host_format,
                              static_cast<const std::byte*>(job.segments[i].dst))) {
      continue;
    }
    if (++refused <= 8) {
      frames += (refused > 1 ? ", " : "") +
                (i < job.hbm_frames.size() ? std::to_string(job.hbm_frames[i]) : std::string("?"));
    }
  }
  if (refused == 0) return Status();
  return invalid_argument(
      "copy hbm->host: " + std::to_string(refused) + " page(s) hold NaN or inf, which " +
      std::string(dtype_name(job.host_format->stored_dtype)) + " cannot store (HBM frame(s) " +
      frames + (refused > 8 ? ", ..." : "") + "); not copied to the host tier");
}

}  // namespace kvtier
