// The fp8 page codec: validate_page_codec_batch (runs everywhere), the launchers' host-side
// rejections (CUDA builds, no GPU needed) and the CUDA kernels against the CPU codec byte for byte
// (skipped with a message where no GPU is present). Pages sit in device memory and in mapped
// pinned host memory, as the HBM and host tiers hold them, in scattered frame order.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/page_codec.hpp"
#include "kvtier/log.hpp"
#include "tests/common/assert_ok.hpp"

#if defined(KVTIER_HAVE_CUDA)
#include <cuda_runtime_api.h>

#include <cmath>
#include <numeric>
#include <random>

#include "kernels/cpu/frame_ops.hpp"
#include "kernels/cpu/isa.hpp"
#include "kernels/cuda/cuda_support.hpp"
#include "kernels/cuda/page_codec_cuda.hpp"
#include "kernels/numeric_formats.hpp"
#endif

namespace kvtier::kernels {
namespace {

// ---------------------------------------------------------------------------------------------
// validate_page_codec_batch: pointer values only, nothing is dereferenced.
// ---------------------------------------------------------------------------------------------

class PageCodecValidate : public ::testing::Test {
 protected:
  static constexpr uint64_t kHalf = 64;  // bf16: wide page 256 bytes, fp8 page 136 bytes

  // A batch of `count` disjoint bf16 -> fp8 pages inside one buffer.
  PageCodecBatch batch(uint32_t count) {
    PageCodecBatch b;
    b.wide = Dtype::kBF16;
    b.half_elems = kHalf;
    b.count = count;
    for (uint32_t i = 0; i < count; ++i) {
      b.src[i] = wide_at(i);
      b.dst[i] = fp8_at(i);
    }
    return b;
  }
  // The decode batch of the same pages: reads the fp8 pages, writes the wide ones.
  static PageCodecBatch reversed(const PageCodecBatch& b) {
    PageCodecBatch d = b;
    for (uint32_t i = 0; i < b.count; ++i) {
      d.src[i] = b.dst[i];
      d.dst[i] = const_cast<void*>(b.src[i]);
    }
    return d;
  }
  uint8_t* wide_at(uint32_t i) { return base() + i * 256; }
  uint8_t* fp8_at(uint32_t i) { return base() + PageCodecBatch::kMaxPages * 256 + i * 256; }

  static void expect_refused(const Status& st, const std::string& mentions) {
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
    EXPECT_NE(st.message().find(mentions), std::string::npos) << st.to_string();
  }

 private:
  uint8_t* base() { return reinterpret_cast<uint8_t*>(memory_.data()); }
  std::vector<uint64_t> memory_ = std::vector<uint64_t>(2 * PageCodecBatch::kMaxPages * 256 / 8);
};

TEST_F(PageCodecValidate, WellFormedBatchesPassInBothDirections) {
  for (uint32_t count : {0u, 1u, 7u, PageCodecBatch::kMaxPages}) {
    const PageCodecBatch b = batch(count);
    EXPECT_TRUE(validate_page_codec_batch(b).ok()) << count;
    EXPECT_TRUE(validate_page_codec_batch(b, PageCodecOp::kEncode).ok()) << count;
    // Decoding reads fp8_at(i) and writes a 256-byte wide page there: still disjoint.
    EXPECT_TRUE(validate_page_codec_batch(reversed(b), PageCodecOp::kDecode).ok()) << count;
  }
  EXPECT_TRUE(validate_page_codec_batch(PageCodecBatch{.half_elems = 1}).ok())
      << "an empty batch with a valid shape";
}

TEST_F(PageCodecValidate, CountAboveMaxPagesIsRefused) {
  PageCodecBatch b = batch(PageCodecBatch::kMaxPages);
  b.count = PageCodecBatch::kMaxPages + 1;
  expect_refused(validate_page_codec_batch(b), "129 pages");
  expect_refused(validate_page_codec_batch(b, PageCodecOp::kEncode), "kMaxPages 128");
}

TEST_F(PageCodecValidate, NullPagesAreRefusedNamingTheEntry) {
  PageCodecBatch b = batch(9);
  b.src[5] = nullptr;
  expect_refused(validate_page_codec_batch(b), "entry 5: source page is null");
  b = batch(9);
  b.dst[8] = nullptr;
  expect_refused(validate_page_codec_batch(b, PageCodecOp::kDecode),
                 "entry 8: destination page is null");
  b = batch(9);
  b.count = 8;
  b.dst[8] = nullptr;  // past count: not part of the batch
  EXPECT_TRUE(validate_page_codec_batch(b).ok());
}

TEST_F(PageCodecValidate, ShapesAreChecked) {
  PageCodecBatch b = batch(3);
  b.wide = Dtype::kFP8E4M3;
  expect_refused(validate_page_codec_batch(b), "not fp8_e4m3");
  b.wide = static_cast<Dtype>(9);
  expect_refused(validate_page_codec_batch(b), "f32, f16 or bf16");
  b = batch(3);
  b.half_elems = 0;
  expect_refused(validate_page_codec_batch(b), "half_elems 0");
  b.half_elems = kMaxPageCodecHalfElems + 1;
  expect_refused(validate_page_codec_batch(b), "half_elems");
  b = batch(0);
  b.half_elems = 0;
  expect_refused(validate_page_codec_batch(b), "half_elems 0");
}

TEST_F(PageCodecValidate, PagesMustBeAlignedToTheWideElements) {
  PageCodecBatch b = batch(4);
  b.src[2] = wide_at(2) + 1;
  expect_refused(validate_page_codec_batch(b), "entry 2: source page");
  b.src[2] = wide_at(2) + 2;  // bf16 elements: 2 bytes suffice
  EXPECT_TRUE(validate_page_codec_batch(b).ok());
  b.wide = Dtype::kF32;
  b.half_elems = 16;  // f32 pages of 128 bytes still fit the 256-byte slots
  expect_refused(validate_page_codec_batch(b), "4-byte f32");
  b.src[2] = wide_at(2);
  b.dst[3] = fp8_at(3) + 2;
  expect_refused(validate_page_codec_batch(b), "entry 3: destination page");
}

TEST_F(PageCodecValidate, OverlappingDestinationsAreRefused) {
  PageCodecBatch b = batch(6);
  b.dst[4] = b.dst[1];
  expect_refused(validate_page_codec_batch(b), "write overlapping destination pages");
  // 136-byte fp8 pages 136 bytes apart: disjoint when encoding; 256-byte wide pages written there
  // when decoding would overlap.
  b = batch(2);
  b.dst[1] = fp8_at(0) + 136;
  EXPECT_TRUE(validate_page_codec_batch(b, PageCodecOp::kEncode).ok());
  b.dst[1] = fp8_at(0) + 134;
  expect_refused(validate_page_codec_batch(b, PageCodecOp::kEncode), "entry 0 and entry 1");
  PageCodecBatch d = batch(2);
  d.src[0] = fp8_at(0);
  d.src[1] = fp8_at(1);
  d.dst[0] = wide_at(0);
  d.dst[1] = wide_at(0) + 136;
  expect_refused(validate_page_codec_batch(d, PageCodecOp::kDecode), "overlapping destination");
}

TEST_F(PageCodecValidate, PagesCannotBeReencodedInPlace) {
  PageCodecBatch b = batch(5);
  b.src[3] = b.dst[3];
  expect_refused(validate_page_codec_batch(b),
                 "entry 3: source page overlaps the destination "
                 "page of entry 3");
  b = batch(5);
  b.src[2] = fp8_at(4) + 130;  // the last bytes of entry 4's fp8 page (its trailer)
  expect_refused(validate_page_codec_batch(b, PageCodecOp::kEncode), "of entry 4");
  b.src[2] = fp8_at(4) + 136;  // just past it
  EXPECT_TRUE(validate_page_codec_batch(b, PageCodecOp::kEncode).ok());
  b.src[2] = fp8_at(4) - 256;  // a wide page ending where entry 4's page begins
  b.dst[3] = fp8_at(4) + 512;
  EXPECT_TRUE(validate_page_codec_batch(b, PageCodecOp::kEncode).ok());
  b.src[2] = fp8_at(4) - 254;
  expect_refused(validate_page_codec_batch(b, PageCodecOp::kEncode), "of entry 4");
}

#if defined(KVTIER_HAVE_CUDA)

namespace kc = kernels::cuda;

// ---------------------------------------------------------------------------------------------
// Launch rejections: decided on the host before any CUDA call, so they run without a GPU.
// ---------------------------------------------------------------------------------------------

// Any non-null value serves as a stream here: the launch is rejected before it is used.
cudaStream_t fake_stream() { return reinterpret_cast<cudaStream_t>(0x1); }

// Collects log lines for the duration of a test.
class LogCapture {
 public:
  LogCapture() {
    set_log_sink([this](LogLevel, std::string_view m) { text_ += std::string(m) + "\n"; });
  }
  ~LogCapture() { set_log_sink({}); }
  const std::string& text() const { return text_; }

 private:
  std::string text_;
};

TEST_F(PageCodecValidate, LaunchersRefuseBadBatchesAndTheDefaultStream) {
  LogCapture log;
  PageCodecBatch b = batch(4);
  b.src[3] = nullptr;
  EXPECT_EQ(kc::launch_encode_pages_fp8(b, fake_stream()), cudaErrorInvalidValue);
  EXPECT_NE(log.text().find("fp8 page encode launch rejected"), std::string::npos) << log.text();
  EXPECT_NE(log.text().find("entry 3"), std::string::npos) << log.text();
  EXPECT_EQ(kc::launch_decode_pages_fp8(b, fake_stream()), cudaErrorInvalidValue);
  EXPECT_NE(log.text().find("fp8 page decode launch rejected"), std::string::npos) << log.text();
  b = batch(4);
  EXPECT_EQ(kc::launch_encode_pages_fp8(b, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(kc::launch_decode_pages_fp8(b, nullptr), cudaErrorInvalidValue);
  EXPECT_NE(log.text().find("legacy default"), std::string::npos) << log.text();
  b.count = PageCodecBatch::kMaxPages + 1;
  EXPECT_EQ(kc::launch_encode_pages_fp8(b, fake_stream()), cudaErrorInvalidValue);
  // Decoding writes 256-byte wide pages: two of them 200 bytes apart overlap.
  b = reversed(batch(2));
  b.dst[1] = static_cast<uint8_t*>(b.dst[0]) + 200;
  EXPECT_EQ(kc::launch_decode_pages_fp8(b, fake_stream()), cudaErrorInvalidValue);
  EXPECT_NE(log.text().find("overlapping destination"), std::string::npos) << log.text();
}

// ---------------------------------------------------------------------------------------------
// Kernels against the CPU codec.
// ---------------------------------------------------------------------------------------------

// cudaHostAlloc'd mapped pinned memory, as the host tier's frames; kernels use device().
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  static Result<PinnedBuffer> allocate(std::size_t bytes) {
    PinnedBuffer b;
    KVTIER_RETURN_IF_ERROR(
        kc::cuda_status(cudaHostAlloc(&b.host_, bytes, cudaHostAllocMapped | cudaHostAllocPortable),
                        "cudaHostAlloc(" + std::to_string(bytes) + " bytes, mapped)"));
    KVTIER_RETURN_IF_ERROR(
        kc::cuda_status(cudaHostGetDevicePointer(&b.device_, b.host_, 0), "mapping pinned memory"));
    return b;
  }
  PinnedBuffer(PinnedBuffer&& o) noexcept { *this = std::move(o); }
  PinnedBuffer& operator=(PinnedBuffer&& o) noexcept {
    if (this != &o) {
      reset();
      std::swap(host_, o.host_);
      std::swap(device_, o.device_);
    }
    return *this;
  }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  ~PinnedBuffer() { reset(); }

  uint8_t* host() const { return static_cast<uint8_t*>(host_); }
  uint8_t* device() const { return static_cast<uint8_t*>(device_); }

 private:
  void reset() noexcept {
    if (host_ != nullptr) {
      const cudaError_t err = cudaFreeHost(host_);
      if (err != cudaSuccess && err != cudaErrorCudartUnloading) {
        ADD_FAILURE() << "cudaFreeHost: " << cudaGetErrorString(err);
      }
    }
    host_ = device_ = nullptr;
  }
  void* host_ = nullptr;
  void* device_ = nullptr;
};

// An arena of equal frames in device memory or in mapped pinned host memory.
class Arena {
 public:
  static Result<Arena> create(bool pinned, std::size_t bytes) {
    Arena a;
    a.pinned_ = pinned;
    a.bytes_ = bytes;
    if (pinned) {
      KVTIER_ASSIGN_OR_RETURN(a.host_, PinnedBuffer::allocate(bytes));
    } else {
      KVTIER_ASSIGN_OR_RETURN(a.dev_, kc::DeviceBuffer::allocate(bytes));
    }
    return a;
  }
  uint8_t* device() const { return pinned_ ? host_.device() : dev_.as<uint8_t>(); }
  Status write(const std::vector<uint8_t>& v, cudaStream_t stream) const {
    if (!pinned_) return kc::copy_to_device(dev_.get(), v.data(), bytes_, stream);
    std::memcpy(host_.host(), v.data(), bytes_);
    return ok_status();
  }
  // After the stream has run the kernels.
  Result<std::vector<uint8_t>> read(cudaStream_t stream) const {
    std::vector<uint8_t> v(bytes_);
    if (pinned_) {
      std::memcpy(v.data(), host_.host(), bytes_);
    } else {
      KVTIER_RETURN_IF_ERROR(kc::copy_to_host(v.data(), dev_.get(), bytes_, stream));
    }
    return v;
  }

 private:
  bool pinned_ = false;
  std::size_t bytes_ = 0;
  kc::DeviceBuffer dev_;
  PinnedBuffer host_;
};

constexpr uint32_t kPageTokens = 16;
constexpr uint32_t kKvHeads = 8;
constexpr uint8_t kUntouchedWide = 0x5A;
constexpr uint8_t kUntouchedFp8 = 0xA5;

std::size_t round_up(std::size_t v, std::size_t to) { return (v + to - 1) / to * to; }

// One codec shape and placement: `frames` wide frames and as many fp8 frames, a batch naming
// `count` of each in two independent shuffled orders.
struct CodecCase {
  Dtype dtype = Dtype::kBF16;
  uint32_t head_dim = 128;
  bool wide_pinned = false;  // the usual placement: wide pages in HBM, fp8 pages in host memory
  bool fp8_pinned = true;
  // fp8 frames back to back from the arena's start plus the wide element size: pages (and their
  // trailers) only 2- or 4-byte aligned, so all take the element-wise path.
  bool fp8_packed = false;
  uint32_t frames = 11;
  uint32_t count = 7;

  uint64_t half() const { return uint64_t{kPageTokens} * kKvHeads * head_dim; }
  std::size_t wide_bytes() const { return 2 * half() * dtype_size(dtype); }
  std::size_t fp8_bytes() const { return 2 * half() + PageFormat::kScaleTrailerBytes; }
  std::size_t wide_stride() const { return round_up(wide_bytes(), 4096); }
  std::size_t fp8_stride() const { return fp8_packed ? fp8_bytes() : round_up(fp8_bytes(), 4096); }
  std::size_t fp8_offset() const { return fp8_packed ? dtype_size(dtype) : 0; }
  // Byte offset of fp8 frame f in its arena, and the arena's size.
  std::size_t fp8_at(uint32_t f) const { return fp8_offset() + f * fp8_stride(); }
  std::size_t fp8_arena_bytes() const { return fp8_at(frames); }
  std::string name() const {
    return std::string(dtype_name(dtype)) + " head_dim " + std::to_string(head_dim) + " wide in " +
           (wide_pinned ? "pinned" : "device") + ", fp8 in " + (fp8_pinned ? "pinned" : "device") +
           (fp8_packed ? " (packed)" : "") + ", " + std::to_string(count) + " pages";
  }
};

std::vector<CodecCase> codec_cases() {
  std::vector<CodecCase> out;
  for (Dtype d : {Dtype::kF32, Dtype::kF16, Dtype::kBF16}) {
    for (uint32_t dim : {64u, 128u}) {
      for (int placement = 0; placement < 3; ++placement) {
        CodecCase c;
        c.dtype = d;
        c.head_dim = dim;
        c.wide_pinned = placement == 1;
        c.fp8_pinned = placement != 1;
        c.fp8_packed = placement == 2;
        out.push_back(c);
      }
    }
  }
  return out;
}

// Random wide pages: each half a normal sample times its own power of two, so scales differ
// between halves and pages; frame 0's K half is all zeros (scale 1).
std::vector<uint8_t> random_wide_arena(const CodecCase& c, std::mt19937& rng) {
  std::vector<uint8_t> arena(c.wide_stride() * c.frames, kUntouchedWide);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-12, 10);
  for (uint32_t f = 0; f < c.frames; ++f) {
    uint8_t* page = arena.data() + f * c.wide_stride();
    for (int h = 0; h < 2; ++h) {
      const float mag = std::ldexp(1.0f, exponent(rng));
      for (uint64_t k = 0; k < c.half(); ++k) {
        const float v = f == 0 && h == 0 ? 0.0f : normal(rng) * mag;
        store_from_float(page, c.dtype, h * c.half() + k, v);
      }
    }
  }
  return arena;
}

// The CPU codec's fp8 page (with its trailer) of a wide page.
std::vector<uint8_t> cpu_encode(const CodecCase& c, const uint8_t* wide) {
  std::vector<uint8_t> out(c.fp8_bytes());
  float scales[2];
  const cpu::IsaKernels* isa = cpu::isa_kernels(cpu::Isa::kAuto);
  cpu::quantize_page_fp8(*isa, wide, c.dtype, c.half(), out.data(), &scales[0], &scales[1]);
  std::memcpy(out.data() + 2 * c.half(), scales, sizeof(scales));
  return out;
}

std::vector<uint8_t> cpu_decode(const CodecCase& c, const uint8_t* fp8) {
  std::vector<uint8_t> out(c.wide_bytes());
  float scales[2];
  std::memcpy(scales, fp8 + 2 * c.half(), sizeof(scales));
  const cpu::IsaKernels* isa = cpu::isa_kernels(cpu::Isa::kAuto);
  cpu::dequantize_page_fp8(*isa, fp8, scales[0], scales[1], c.dtype, c.half(), out.data());
  return out;
}

std::vector<uint32_t> shuffled_frames(uint32_t frames, uint32_t count, std::mt19937& rng) {
  std::vector<uint32_t> v(frames);
  std::iota(v.begin(), v.end(), 0u);
  std::shuffle(v.begin(), v.end(), rng);
  v.resize(count);
  return v;
}

// Index of the first differing byte, or -1.
long long first_difference(const uint8_t* got, const std::vector<uint8_t>& want) {
  for (std::size_t i = 0; i < want.size(); ++i) {
    if (got[i] != want[i]) return static_cast<long long>(i);
  }
  return -1;
}

class CudaPageCodec : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NE(cpu::isa_kernels(cpu::Isa::kAuto), nullptr);
    const Status st = kc::gpu_available();
    if (!st.ok()) GTEST_SKIP() << "no usable GPU here: " << st.to_string();
    auto s = kc::CudaStream::create();
    ASSERT_TRUE(s.ok()) << s.status().to_string();
    stream_ = std::move(s).value();
  }

  // Encodes the batch wide_frames[i] -> fp8_frames[i] of `wide` on the GPU into an fp8 arena
  // (initially kUntouchedFp8 everywhere) and checks every byte of that arena: the CPU's pages
  // where the batch wrote, untouched bytes elsewhere. Returns the arena.
  std::vector<uint8_t> encode_and_check(const CodecCase& c, const std::vector<uint8_t>& wide,
                                        const std::vector<uint32_t>& wide_frames,
                                        const std::vector<uint32_t>& fp8_frames) {
    std::vector<uint8_t> fp8_host(c.fp8_arena_bytes(), kUntouchedFp8);
    auto wide_arena = Arena::create(c.wide_pinned, wide.size());
    auto fp8_arena = Arena::create(c.fp8_pinned, fp8_host.size());
    EXPECT_TRUE(wide_arena.ok() && fp8_arena.ok());
    if (!wide_arena.ok() || !fp8_arena.ok()) return {};
    EXPECT_TRUE(wide_arena->write(wide, stream_.get()).ok());
    EXPECT_TRUE(fp8_arena->write(fp8_host, stream_.get()).ok());

    PageCodecBatch b;
    b.wide = c.dtype;
    b.half_elems = c.half();
    b.count = c.count;
    for (uint32_t i = 0; i < c.count; ++i) {
      b.src[i] = wide_arena->device() + wide_frames[i] * c.wide_stride();
      b.dst[i] = fp8_arena->device() + c.fp8_at(fp8_frames[i]);
    }
    EXPECT_EQ(kc::launch_encode_pages_fp8(b, stream_.get()), cudaSuccess) << c.name();
    EXPECT_TRUE(stream_.synchronize().ok()) << c.name();
    auto got = fp8_arena->read(stream_.get());
    EXPECT_TRUE(got.ok());
    if (!got.ok()) return {};

    for (uint32_t i = 0; i < c.count; ++i) {
      const std::vector<uint8_t> want =
          cpu_encode(c, wide.data() + wide_frames[i] * c.wide_stride());
      std::memcpy(fp8_host.data() + c.fp8_at(fp8_frames[i]), want.data(), want.size());
    }
    const long long at = first_difference(got->data(), fp8_host);
    EXPECT_EQ(at, -1) << c.name() << ": fp8 arena byte " << at;
    return std::move(got).value();
  }

  // Decodes fp8_frames[i] -> wide_frames[i] of `fp8` on the GPU into a wide arena initially
  // kUntouchedWide and checks every byte against the CPU's decode.
  void decode_and_check(const CodecCase& c, const std::vector<uint8_t>& fp8,
                        const std::vector<uint32_t>& fp8_frames,
                        const std::vector<uint32_t>& wide_frames) {
    std::vector<uint8_t> wide_host(c.wide_stride() * c.frames, kUntouchedWide);
    auto wide_arena = Arena::create(c.wide_pinned, wide_host.size());
    auto fp8_arena = Arena::create(c.fp8_pinned, fp8.size());
    ASSERT_TRUE(wide_arena.ok() && fp8_arena.ok());
    KVTIER_ASSERT_OK(wide_arena->write(wide_host, stream_.get()));
    KVTIER_ASSERT_OK(fp8_arena->write(fp8, stream_.get()));

    PageCodecBatch b;
    b.wide = c.dtype;
    b.half_elems = c.half();
    b.count = c.count;
    for (uint32_t i = 0; i < c.count; ++i) {
      b.src[i] = fp8_arena->device() + c.fp8_at(fp8_frames[i]);
      b.dst[i] = wide_arena->device() + wide_frames[i] * c.wide_stride();
    }
    ASSERT_EQ(kc::launch_decode_pages_fp8(b, stream_.get()), cudaSuccess) << c.name();
    KVTIER_ASSERT_OK(stream_.synchronize());
    auto got = wide_arena->read(stream_.get());
    ASSERT_TRUE(got.ok());

    for (uint32_t i = 0; i < c.count; ++i) {
      const std::vector<uint8_t> want = cpu_decode(c, fp8.data() + c.fp8_at(fp8_frames[i]));
      std::memcpy(wide_host.data() + wide_frames[i] * c.wide_stride(), want.data(), want.size());
    }
    const long long at = first_difference(got->data(), wide_host);
    EXPECT_EQ(at, -1) << c.name() << ": wide arena byte " << at << " (frame "
                      << (at < 0 ? 0 : at / static_cast<long long>(c.wide_stride())) << ")";
  }

  kc::CudaStream stream_;
};

TEST_F(CudaPageCodec, EncodeAndDecodeEqualTheCpuCodecByteForByte) {
  std::mt19937 rng(55);
  for (const CodecCase& c : codec_cases()) {
    const std::vector<uint8_t> wide = random_wide_arena(c, rng);
    std::vector<uint32_t> wide_frames = shuffled_frames(c.frames, c.count, rng);
    // Frame 0 (its all-zero K half) first in the batch.
    const auto zero = std::find(wide_frames.begin(), wide_frames.end(), 0u);
    if (zero != wide_frames.end()) {
      std::iter_swap(wide_frames.begin(), zero);
    } else {
      wide_frames[0] = 0;
    }
    std::vector<uint32_t> fp8_frames = shuffled_frames(c.frames, c.count, rng);
    std::vector<uint8_t> fp8;
    ASSERT_NO_FATAL_FAILURE(fp8 = encode_and_check(c, wide, wide_frames, fp8_frames));
    ASSERT_FALSE(fp8.empty()) << c.name();
    float zero_half_scale = 0.0f;
    std::memcpy(&zero_half_scale, fp8.data() + c.fp8_at(fp8_frames[0]) + 2 * c.half(), 4);
    EXPECT_EQ(zero_half_scale, 1.0f) << c.name();
    // Decode the GPU's pages back into other frames (another shuffle).
    decode_and_check(c, fp8, fp8_frames, shuffled_frames(c.frames, c.count, rng));
  }
}

TEST_F(CudaPageCodec, AFullBatchOfMaxPagesRoundTrips) {
  CodecCase c;  // bf16, head_dim 128: HBM pages to pinned host frames and back
  c.frames = PageCodecBatch::kMaxPages + 5;
  c.count = PageCodecBatch::kMaxPages;
  std::mt19937 rng(56);
  const std::vector<uint8_t> wide = random_wide_arena(c, rng);
  const std::vector<uint32_t> wide_frames = shuffled_frames(c.frames, c.count, rng);
  const std::vector<uint32_t> fp8_frames = shuffled_frames(c.frames, c.count, rng);
  std::vector<uint8_t> fp8;
  ASSERT_NO_FATAL_FAILURE(fp8 = encode_and_check(c, wide, wide_frames, fp8_frames));
  ASSERT_FALSE(fp8.empty());
  decode_and_check(c, fp8, fp8_frames, shuffled_frames(c.frames, c.count, rng));
}

TEST_F(CudaPageCodec, AHalfWithNanOrInfGetsANanScaleAndZeroBytes) {
  for (Dtype d : {Dtype::kF32, Dtype::kF16, Dtype::kBF16}) {
    for (bool packed : {false, true}) {
      CodecCase c;
      c.dtype = d;
      c.fp8_packed = packed;
      c.frames = 4;
      c.count = 4;
      std::mt19937 rng(57);
      std::vector<uint8_t> wide = random_wide_arena(c, rng);
      // Frame 1: NaN in V. Frame 2: +inf in K. Frame 3: -inf and NaN in both halves.
      store_from_float(wide.data() + 1 * c.wide_stride(), d, c.half() + 17, std::nanf(""));
      store_from_float(wide.data() + 2 * c.wide_stride(), d, 5, INFINITY);
      store_from_float(wide.data() + 3 * c.wide_stride(), d, c.half() - 1, -INFINITY);
      store_from_float(wide.data() + 3 * c.wide_stride(), d, 2 * c.half() - 1, std::nanf(""));
      const std::vector<uint32_t> frames = {0, 1, 2, 3};
      std::vector<uint8_t> fp8;
      ASSERT_NO_FATAL_FAILURE(fp8 = encode_and_check(c, wide, frames, frames));
      ASSERT_FALSE(fp8.empty());
      // The CPU comparison above covers the bytes; say what they are.
      const bool refused[4][2] = {{false, false}, {false, true}, {true, false}, {true, true}};
      for (uint32_t f = 0; f < 4; ++f) {
        const uint8_t* page = fp8.data() + c.fp8_at(f);
        for (int h = 0; h < 2; ++h) {
          float scale = 0.0f;
          std::memcpy(&scale, page + 2 * c.half() + 4 * h, 4);
          EXPECT_EQ(std::isnan(scale), refused[f][h])
              << c.name() << " frame " << f << " half " << h << " scale " << scale;
          if (refused[f][h]) {
            const uint8_t* bytes = page + h * c.half();
            EXPECT_TRUE(std::all_of(bytes, bytes + c.half(), [](uint8_t v) { return v == 0; }))
                << c.name() << " frame " << f << " half " << h;
          }
        }
      }
    }
  }
}

#endif  // KVTIER_HAVE_CUDA

}  // namespace
}  // namespace kvtier::kernels
