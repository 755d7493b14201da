// Fashion-MNIST (Xiao, Rasul, Vollgraf 2017: 60k train / 10k test 28x28 grey images, 10 classes) from the gzipped
// IDX files of Debian's dataset-fashion-mnist package. The IDX format (LeCun's MNIST page): a big-endian magic of
// two zero bytes, a type byte (0x08 = unsigned byte) and a dimension count, then one big-endian u32 per dimension,
// then the data. Everything read from the files is validated; a bad file is an InvalidPayload naming the file.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "experiments/workloads/dataset.h"

namespace terse::workloads {

// Where the Debian package installs the files.
inline constexpr const char* kDefaultFashionMnistDir = "/usr/share/datasets/fashion-mnist";

struct FashionMnistOptions {
  std::string dir = kDefaultFashionMnistDir;
  int64_t max_train = 0;  // > 0: keep only the first max_train training examples
  int64_t max_test = 0;   // > 0: keep only the first max_test test examples
  // Pixels are scaled to [0, 1]; standardize additionally subtracts the training set's mean and divides by its
  // standard deviation (one scalar each, computed over the kept training examples, applied to both sets).
  bool standardize = false;
};

// Loads train-{images,labels} and t10k-{images,labels}. A missing directory is an InvalidArgument that names the
// package to install.
DataSplit loadFashionMnist(const FashionMnistOptions& options = {});

// Reads one gzipped (or plain: zlib reads both) IDX image file (u8, 3 dims) and its label file (u8, 1 dim) into a
// Dataset with pixels in [0, 1] and num_classes = 10; max_examples > 0 keeps the first ones. Throws InvalidPayload
// for a wrong magic, zero or oversized dimensions, a truncated file, trailing bytes, a label >= 10, or an image
// count that differs from the label count.
Dataset readIdxDataset(const std::string& images_path, const std::string& labels_path, int64_t max_examples = 0);
// The same from the files' decompressed bytes (what readIdxDataset does once it has read them; the fuzz target's
// entry); the names are the files' in messages.
Dataset decodeIdxDataset(std::span<const uint8_t> images, std::span<const uint8_t> labels, int64_t max_examples,
                         const std::string& images_name, const std::string& labels_name);

}  // namespace terse::workloads
