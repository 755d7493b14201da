// The IDX reader on gzipped files the test writes itself: a valid pair, and each way a file can be wrong.
#include <gtest/gtest.h>
#include <zlib.h>

#include <filesystem>
#include <string>
#include <vector>

#include "core/common/error.h"
#include "experiments/workloads/fashion_mnist.h"

namespace terse::workloads {
namespace {

namespace fs = std::filesystem;

std::vector<uint8_t> idxHeader(uint8_t ndims, const std::vector<uint32_t>& dims) {
  std::vector<uint8_t> b = {0, 0, 0x08, ndims};
  for (uint32_t d : dims) {
    for (int shift : {24, 16, 8, 0}) b.push_back(static_cast<uint8_t>(d >> shift));
  }
  return b;
}

std::vector<uint8_t> imagesFile(uint32_t n, uint32_t rows, uint32_t cols) {
  std::vector<uint8_t> b = idxHeader(3, {n, rows, cols});
  for (uint32_t i = 0; i < n * rows * cols; ++i) b.push_back(static_cast<uint8_t>(i % 256));
  return b;
}

std::vector<uint8_t> labelsFile(uint32_t n) {
  std::vector<uint8_t> b = idxHeader(1, {n});
  for (uint32_t i = 0; i < n; ++i) b.push_back(static_cast<uint8_t>(i % 10));
  return b;
}

class IdxReader : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(TERSE_TEST_BINARY_DIR) / "tests" / "workloads" /
           ("idx_" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string writeGz(const std::string& name, const std::vector<uint8_t>& bytes) {
    const std::string path = (dir_ / name).string();
    gzFile f = gzopen(path.c_str(), "wb");
    EXPECT_NE(f, nullptr);
    EXPECT_EQ(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())), static_cast<int>(bytes.size()));
    gzclose(f);
    return path;
  }

  // Expects readIdxDataset to throw InvalidPayload whose message contains every fragment.
  void expectBad(const std::string& images, const std::string& labels, const std::vector<std::string>& fragments) {
    try {
      readIdxDataset(images, labels);
      ADD_FAILURE() << "expected InvalidPayload";
    } catch (const InvalidPayload& e) {
      for (const std::string& f : fragments)
        EXPECT_NE(std::string(e.what()).find(f), std::string::npos) << "'" << f << "' not in: " << e.what();
    }
  }

  fs::path dir_;
};

TEST_F(IdxReader, ReadsValidFiles) {
  const Dataset d = readIdxDataset(writeGz("img.gz", imagesFile(5, 3, 4)), writeGz("lbl.gz", labelsFile(5)));
  EXPECT_EQ(d.num_examples, 5);
  EXPECT_EQ(d.rows, 3);
  EXPECT_EQ(d.cols, 4);
  EXPECT_EQ(d.dims, 12);
  EXPECT_EQ(d.num_classes, 10);
  ASSERT_EQ(d.features.size(), 60u);
  EXPECT_FLOAT_EQ(d.features[0], 0.0f);
  EXPECT_FLOAT_EQ(d.features[13], 13.0f / 255.0f);
  EXPECT_EQ(d.labels, (std::vector<int32_t>{0, 1, 2, 3, 4}));
  const Dataset head = readIdxDataset((dir_ / "img.gz").string(), (dir_ / "lbl.gz").string(), 2);
  EXPECT_EQ(head.num_examples, 2);
  EXPECT_EQ(head.features.size(), 24u);
}

TEST_F(IdxReader, TruncatedData) {
  std::vector<uint8_t> img = imagesFile(5, 3, 4);
  img.resize(img.size() - 7);
  expectBad(writeGz("img.gz", img), writeGz("lbl.gz", labelsFile(5)),
            {"img.gz", "truncated", "promises 60 data bytes, found 53"});
}

TEST_F(IdxReader, TruncatedHeader) {
  std::vector<uint8_t> img = imagesFile(5, 3, 4);
  img.resize(9);
  expectBad(writeGz("img.gz", img), writeGz("lbl.gz", labelsFile(5)), {"img.gz", "truncated inside its header"});
}

TEST_F(IdxReader, TruncatedGzipStream) {
  // Cut the compressed bytes, not the payload: zlib reports the broken stream.
  const std::string full = writeGz("full.gz", imagesFile(50, 10, 10));
  std::vector<char> bytes(fs::file_size(full));
  FILE* f = std::fopen(full.c_str(), "rb");
  ASSERT_EQ(std::fread(bytes.data(), 1, bytes.size(), f), bytes.size());
  std::fclose(f);
  const std::string cut = (dir_ / "cut.gz").string();
  f = std::fopen(cut.c_str(), "wb");
  std::fwrite(bytes.data(), 1, bytes.size() / 2, f);
  std::fclose(f);
  expectBad(cut, writeGz("lbl.gz", labelsFile(50)), {"cut.gz"});
}

TEST_F(IdxReader, TrailingBytes) {
  std::vector<uint8_t> lbl = labelsFile(5);
  lbl.push_back(1);
  expectBad(writeGz("img.gz", imagesFile(5, 3, 4)), writeGz("lbl.gz", lbl), {"lbl.gz", "trailing bytes"});
}

TEST_F(IdxReader, WrongMagic) {
  // A label file where an image file belongs: 1 dimension instead of 3.
  expectBad(writeGz("img.gz", labelsFile(5)), writeGz("lbl.gz", labelsFile(5)),
            {"img.gz", "magic 0x801, expected 0x803"});
  std::vector<uint8_t> wrong_type = imagesFile(5, 3, 4);
  wrong_type[2] = 0x0D;  // float data
  expectBad(writeGz("img2.gz", wrong_type), writeGz("lbl.gz", labelsFile(5)), {"img2.gz", "magic 0xd03"});
}

TEST_F(IdxReader, CountMismatch) {
  expectBad(writeGz("img.gz", imagesFile(5, 3, 4)), writeGz("lbl.gz", labelsFile(4)),
            {"img.gz", "has 5 images", "lbl.gz", "has 4 labels"});
}

TEST_F(IdxReader, LabelOutOfRange) {
  std::vector<uint8_t> lbl = labelsFile(5);
  lbl.back() = 10;
  expectBad(writeGz("img.gz", imagesFile(5, 3, 4)), writeGz("lbl.gz", lbl), {"lbl.gz", "label 10 at index 4"});
}

TEST_F(IdxReader, ZeroDimensionAndMissingFile) {
  expectBad(writeGz("img.gz", imagesFile(5, 0, 4)), writeGz("lbl.gz", labelsFile(5)),
            {"img.gz", "dimension 1 of size 0"});
  EXPECT_THROW(readIdxDataset((dir_ / "nope.gz").string(), (dir_ / "nope2.gz").string()), InvalidArgument);
}

TEST_F(IdxReader, MissingDirectoryNamesThePackage) {
  FashionMnistOptions o;
  o.dir = (dir_ / "absent").string();
  try {
    loadFashionMnist(o);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("apt-get install dataset-fashion-mnist"), std::string::npos) << e.what();
  }
}

TEST_F(IdxReader, LoadsADirectoryAndStandardizes) {
  writeGz("train-images-idx3-ubyte.gz", imagesFile(6, 4, 4));
  writeGz("train-labels-idx1-ubyte.gz", labelsFile(6));
  writeGz("t10k-images-idx3-ubyte.gz", imagesFile(3, 4, 4));
  writeGz("t10k-labels-idx1-ubyte.gz", labelsFile(3));
  FashionMnistOptions o;
  o.dir = dir_.string();
  o.standardize = true;
  const DataSplit s = loadFashionMnist(o);
  EXPECT_EQ(s.train.num_examples, 6);
  EXPECT_EQ(s.test.num_examples, 3);
  double mean = 0.0, sq = 0.0;
  for (float v : s.train.features) {
    mean += v;
    sq += static_cast<double>(v) * v;
  }
  mean /= static_cast<double>(s.train.features.size());
  EXPECT_NEAR(mean, 0.0, 1e-6);
  EXPECT_NEAR(sq / static_cast<double>(s.train.features.size()), 1.0, 1e-5);
}

}  // namespace
}  // namespace terse::workloads
