// Runs a fuzz target over every file of the given directories (the regression corpus),
// so that `meson test` replays it without libFuzzer.
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

int main(int argc, char** argv) {
  size_t count = 0;
  for (int i = 1; i < argc; ++i)
    for (auto& entry : std::filesystem::directory_iterator(argv[i])) {
      std::ifstream in{entry.path(), std::ios::binary};
      std::vector<char> bytes{std::istreambuf_iterator<char>(in), {}};
      LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
      ++count;
    }
  std::printf("replayed %zu inputs\n", count);
  return count > 0 ? 0 : 1;
}
