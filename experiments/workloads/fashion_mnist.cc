#include "experiments/workloads/fashion_mnist.h"

#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <span>
#include <vector>

#include "core/common/error.h"

namespace terse::workloads {
namespace {

constexpr uint8_t kIdxTypeU8 = 0x08;
constexpr int32_t kFashionMnistClasses = 10;
// Bounds the allocation an untrusted header can ask for: 1 GiB is far above any IDX data set we read.
constexpr uint64_t kMaxIdxDataBytes = uint64_t{1} << 30;

// A gzFile that closes itself; read() reports how many bytes it got and turns zlib errors into InvalidPayload.
class GzFile {
 public:
  explicit GzFile(const std::string& path) : path_(path), file_(gzopen(path.c_str(), "rb")) {
    TERSE_CHECK(file_ != nullptr, InvalidArgument, "cannot open IDX file '" << path << "'");
  }
  ~GzFile() { gzclose(file_); }
  GzFile(const GzFile&) = delete;
  GzFile& operator=(const GzFile&) = delete;

  uint64_t read(uint8_t* dst, uint64_t n) {
    uint64_t got = 0;
    while (got < n) {
      // gzread takes an unsigned length; chunk to stay far below its limit.
      const auto chunk = static_cast<unsigned>(std::min<uint64_t>(n - got, uint64_t{1} << 28));
      const int r = gzread(file_, dst + got, chunk);
      if (r < 0) {
        int code = 0;
        const char* msg = gzerror(file_, &code);
        TERSE_THROW(InvalidPayload, "IDX file '" << path_ << "' is corrupt or truncated after " << got << " bytes of a "
                                                 << n << "-byte read: " << (msg ? msg : "?"));
      }
      if (r == 0) break;
      got += static_cast<uint64_t>(r);
    }
    return got;
  }

 private:
  std::string path_;
  gzFile file_;
};

uint32_t bigEndian32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

// The file's decompressed bytes. A file longer than `limit` is refused once `limit` + 1 bytes are in, so memory
// follows what the file holds, not what its header claims.
std::vector<uint8_t> readAllBytes(const std::string& path, uint64_t limit) {
  GzFile file(path);
  std::vector<uint8_t> out;
  constexpr uint64_t kChunk = uint64_t{1} << 20;
  for (;;) {
    const uint64_t at = out.size();
    const uint64_t want = std::min<uint64_t>(kChunk, limit + 1 - at);
    out.resize(at + want);
    const uint64_t got = file.read(out.data() + at, want);
    out.resize(at + got);
    if (got < want || out.size() > limit) return out;
  }
}

// Validates an unsigned-byte IDX image of `ndims` dimensions; returns its data and fills dims.
std::span<const uint8_t> decodeIdxU8(std::span<const uint8_t> bytes, int ndims, std::vector<int64_t>& dims,
                                     const std::string& path) {
  TERSE_CHECK(bytes.size() >= 4, InvalidPayload,
              "IDX file '" << path << "' is truncated: " << bytes.size() << " bytes, shorter than the 4-byte magic");
  const uint32_t expected_magic = (uint32_t{kIdxTypeU8} << 8) | static_cast<uint32_t>(ndims);
  TERSE_CHECK(bigEndian32(bytes.data()) == expected_magic, InvalidPayload,
              "IDX file '" << path << "' has magic 0x" << std::hex << bigEndian32(bytes.data()) << ", expected 0x"
                           << expected_magic << std::dec << " (unsigned bytes, " << ndims << " dimensions)");
  const std::size_t header_bytes = 4 + 4 * static_cast<std::size_t>(ndims);
  TERSE_CHECK(bytes.size() >= header_bytes, InvalidPayload,
              "IDX file '" << path << "' is truncated inside its header: " << bytes.size() - 4 << " of "
                           << header_bytes - 4 << " dimension bytes");
  dims.clear();
  uint64_t total = 1;
  for (int d = 0; d < ndims; ++d) {
    const uint32_t size = bigEndian32(bytes.data() + 4 + 4 * d);
    TERSE_CHECK(size > 0, InvalidPayload, "IDX file '" << path << "' has dimension " << d << " of size 0");
    total *= size;
    TERSE_CHECK(total <= kMaxIdxDataBytes, InvalidPayload,
                "IDX file '" << path << "' claims more than " << kMaxIdxDataBytes << " bytes of data");
    dims.push_back(size);
  }
  const uint64_t found = bytes.size() - header_bytes;
  TERSE_CHECK(
      found >= total, InvalidPayload,
      "IDX file '" << path << "' is truncated: its header promises " << total << " data bytes, found " << found);
  TERSE_CHECK(found == total, InvalidPayload,
              "IDX file '" << path << "' has trailing bytes after the " << total << " data bytes its header describes");
  return bytes.subspan(header_bytes);
}

void standardize(DataSplit& split) {
  double sum = 0.0, sum_sq = 0.0;
  for (float v : split.train.features) {
    sum += v;
    sum_sq += static_cast<double>(v) * v;
  }
  const auto n = static_cast<double>(split.train.features.size());
  const double mean = sum / n;
  const double stddev = std::sqrt(std::max(sum_sq / n - mean * mean, 1e-12));
  for (Dataset* set : {&split.train, &split.test})
    for (float& v : set->features) v = static_cast<float>((v - mean) / stddev);
}

}  // namespace

Dataset readIdxDataset(const std::string& images_path, const std::string& labels_path, int64_t max_examples) {
  // The largest file an IDX header of up to 3 dimensions can describe, plus one byte to tell trailing bytes.
  constexpr uint64_t kMaxFileBytes = 4 + 4 * 3 + kMaxIdxDataBytes;
  const std::vector<uint8_t> images = readAllBytes(images_path, kMaxFileBytes);
  const std::vector<uint8_t> labels = readAllBytes(labels_path, kMaxFileBytes);
  return decodeIdxDataset(images, labels, max_examples, images_path, labels_path);
}

Dataset decodeIdxDataset(std::span<const uint8_t> images, std::span<const uint8_t> labels, int64_t max_examples,
                         const std::string& images_name, const std::string& labels_name) {
  std::vector<int64_t> image_dims, label_dims;
  const std::span<const uint8_t> pixels = decodeIdxU8(images, 3, image_dims, images_name);
  const std::span<const uint8_t> label_bytes = decodeIdxU8(labels, 1, label_dims, labels_name);
  TERSE_CHECK(image_dims[0] == label_dims[0], InvalidPayload,
              "IDX files disagree on the example count: '" << images_name << "' has " << image_dims[0] << " images, '"
                                                           << labels_name << "' has " << label_dims[0] << " labels");
  Dataset set;
  set.num_examples = max_examples > 0 ? std::min(max_examples, image_dims[0]) : image_dims[0];
  set.rows = image_dims[1];
  set.cols = image_dims[2];
  set.dims = set.rows * set.cols;
  set.num_classes = kFashionMnistClasses;
  set.features.resize(static_cast<std::size_t>(set.num_examples * set.dims));
  for (std::size_t i = 0; i < set.features.size(); ++i) set.features[i] = static_cast<float>(pixels[i]) / 255.0f;
  set.labels.resize(static_cast<std::size_t>(set.num_examples));
  for (std::size_t i = 0; i < set.labels.size(); ++i) {
    TERSE_CHECK(label_bytes[i] < kFashionMnistClasses, InvalidPayload,
                "IDX file '" << labels_name << "' has label " << int{label_bytes[i]} << " at index " << i
                             << ", expected 0.." << kFashionMnistClasses - 1);
    set.labels[i] = label_bytes[i];
  }
  return set;
}

DataSplit loadFashionMnist(const FashionMnistOptions& options) {
  namespace fs = std::filesystem;
  const fs::path dir(options.dir);
  TERSE_CHECK(fs::is_directory(dir), InvalidArgument,
              "Fashion-MNIST directory '" << options.dir
                                          << "' does not exist; install the Debian package with `apt-get install "
                                             "dataset-fashion-mnist` or point the data path at a copy of the files");
  DataSplit split;
  split.train = readIdxDataset((dir / "train-images-idx3-ubyte.gz").string(),
                               (dir / "train-labels-idx1-ubyte.gz").string(), options.max_train);
  split.test = readIdxDataset((dir / "t10k-images-idx3-ubyte.gz").string(),
                              (dir / "t10k-labels-idx1-ubyte.gz").string(), options.max_test);
  TERSE_CHECK(split.train.rows == split.test.rows && split.train.cols == split.test.cols, InvalidPayload,
              "Fashion-MNIST in '" << options.dir << "': train images are " << split.train.rows << "x"
                                   << split.train.cols << " but test images are " << split.test.rows << "x"
                                   << split.test.cols);
  if (options.standardize) standardize(split);
  return split;
}

}  // namespace terse::workloads
