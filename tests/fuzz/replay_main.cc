// The driver of a fuzz target in builds without libFuzzer (GCC): runs the target over every file of the directories
// and files it is given -- the committed seed corpus and the regressions, inputs that once crashed a target -- so
// every build, not only the fuzz build, checks them. Flags (arguments starting with '-', libFuzzer's) are ignored.
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size);

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  std::vector<fs::path> files;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.empty() || arg[0] == '-') continue;
    if (fs::is_directory(arg)) {
      for (const auto& e : fs::recursive_directory_iterator(arg))
        if (e.is_regular_file()) files.push_back(e.path());
    } else if (fs::is_regular_file(arg)) {
      files.emplace_back(arg);
    } else {
      // A target without regressions has no folder for them (git keeps no empty folders).
      std::printf("replay: %s does not exist, skipped\n", arg.c_str());
    }
  }
  if (files.empty()) {
    std::fprintf(stderr, "replay: no inputs (give the corpus and regression folders)\n");
    return 2;
  }
  for (const auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  }
  std::printf("replay: %zu inputs, no failure\n", files.size());
  return 0;
}
