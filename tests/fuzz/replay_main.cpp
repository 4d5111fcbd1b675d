// Runs the fuzz target's checks on saved inputs without libFuzzer, so every
// build of the test suite (any compiler, any sanitizer) replays the corpus.
//   rope_fuzz_replay FILE_OR_DIR...
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);

namespace {

int replay_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "rope_fuzz_replay: cannot read %s\n", path.c_str());
    return 1;
  }
  const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // An exact-size heap copy: a read past the input is an overflow the
  // sanitizers see, as under libFuzzer.
  std::vector<std::uint8_t> data(bytes.begin(), bytes.end());
  LLVMFuzzerTestOneInput(data.empty() ? nullptr : data.data(), data.size());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t inputs = 0;
  int failures = 0;
  for (int i = 1; i < argc; ++i) {
    const std::filesystem::path arg(argv[i]);
    if (std::filesystem::is_directory(arg)) {
      for (const auto& entry : std::filesystem::directory_iterator(arg)) {
        if (!entry.is_regular_file()) continue;
        failures += replay_file(entry.path());
        ++inputs;
      }
    } else {
      failures += replay_file(arg);
      ++inputs;
    }
  }
  std::printf("rope_fuzz_replay: %zu inputs replayed\n", inputs);
  if (inputs == 0) {
    std::fprintf(stderr, "rope_fuzz_replay: no inputs\n");
    return 1;
  }
  return failures == 0 ? 0 : 1;
}
