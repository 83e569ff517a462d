// Runs a libFuzzer target without libFuzzer: every file of the seed corpus, then a fixed number of
// deterministic mutations of them (byte flips, truncations, splices, inserted bytes). No coverage
// feedback, so it finds less than libFuzzer does; its job is to keep gcc builds exercising the
// target and to replay crash reproducers: `fuzz_replay_<name> CORPUS_DIR_OR_FILE...`.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

constexpr int kMutationsPerSeed = 400;

std::vector<uint8_t> read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void mutate(std::vector<uint8_t>& d, std::mt19937& rng, const std::vector<uint8_t>& other) {
  switch (rng() % 5) {
    case 0:
      if (!d.empty()) d[rng() % d.size()] ^= static_cast<uint8_t>(1u << (rng() % 8));
      break;
    case 1:
      if (!d.empty()) d.resize(rng() % d.size());
      break;
    case 2:
      d.insert(d.begin() + static_cast<long>(d.empty() ? 0 : rng() % d.size()),
               static_cast<uint8_t>(rng()));
      break;
    case 3:
      if (!other.empty()) {
        const std::size_t cut = d.empty() ? 0 : rng() % d.size();
        const std::size_t from = rng() % other.size();
        d.resize(cut);
        d.insert(d.end(), other.begin() + static_cast<long>(from), other.end());
      }
      break;
    default:
      if (!d.empty()) d[rng() % d.size()] = static_cast<uint8_t>(rng());
      break;
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::vector<uint8_t>> seeds;
  for (int i = 1; i < argc; ++i) {
    const std::filesystem::path arg(argv[i]);
    if (std::filesystem::is_directory(arg)) {
      for (const auto& entry : std::filesystem::directory_iterator(arg)) {
        if (entry.is_regular_file()) seeds.push_back(read_file(entry.path()));
      }
    } else {
      seeds.push_back(read_file(arg));
    }
  }
  if (seeds.empty()) seeds.emplace_back();
  std::mt19937 rng(12345);
  std::size_t runs = 0;
  for (const auto& seed : seeds) {
    LLVMFuzzerTestOneInput(seed.data(), seed.size());
    ++runs;
    std::vector<uint8_t> cur = seed;
    for (int m = 0; m < kMutationsPerSeed; ++m) {
      mutate(cur, rng, seeds[rng() % seeds.size()]);
      LLVMFuzzerTestOneInput(cur.data(), cur.size());
      ++runs;
      if (rng() % 8 == 0) cur = seed;
    }
  }
  std::printf("%zu inputs from %zu seeds ran without a crash\n", runs, seeds.size());
  return 0;
}
