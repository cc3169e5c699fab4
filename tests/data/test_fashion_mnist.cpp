// Fashion-MNIST from the Debian package: sizes, labels, normalization, and the
// errors for missing, truncated, corrupt and non-IDX files.
#include <crucible/data/error.h>
#include <crucible/data/fashion_mnist.h>

#include <ATen/ATen.h>
#include <zlib.h>

#include <unistd.h>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "catch.h"
#include "data_dir.h"
#include "testing.h"

using namespace crucible::data;
namespace fs = std::filesystem;

namespace {

const std::string kDir = fashion_mnist_test_dir();

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

fs::path temp_file(const std::string& name, const std::string& bytes) {
  fs::path dir = fs::temp_directory_path() / ("crucible-test-pipeline-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  fs::path p = dir / name;
  std::ofstream(p, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return p;
}

fs::path temp_gz(const std::string& name, const std::string& raw) {
  fs::path p = temp_file(name, "");
  gzFile f = gzopen(p.c_str(), "wb");
  REQUIRE(f);
  REQUIRE(gzwrite(f, raw.data(), static_cast<unsigned>(raw.size())) == static_cast<int>(raw.size()));
  gzclose(f);
  return p;
}

}  // namespace

TEST_CASE("Fashion-MNIST splits have the published sizes and labels", "[pipeline][data]") {
  FashionMnist train = load_fashion_mnist(Split::Train, kDir);
  FashionMnist test = load_fashion_mnist(Split::Test, kDir);
  REQUIRE(train.images.sizes() == at::IntArrayRef{60000, 1, 28, 28});
  REQUIRE(train.labels.sizes() == at::IntArrayRef{60000});
  REQUIRE(test.images.sizes() == at::IntArrayRef{10000, 1, 28, 28});
  REQUIRE(test.labels.sizes() == at::IntArrayRef{10000});
  REQUIRE(train.images.scalar_type() == at::kFloat);
  REQUIRE(train.labels.scalar_type() == at::kLong);
  // Ten balanced classes: 6000 and 1000 examples of each of 0..9.
  REQUIRE_EQUAL_TENSORS(at::bincount(train.labels), at::full({10}, 6000, at::kLong));
  REQUIRE_EQUAL_TENSORS(at::bincount(test.labels), at::full({10}, 1000, at::kLong));
  // The first labels as Python's gzip module decodes them, an independent reader.
  REQUIRE_EQUAL_TENSORS(train.labels.slice(0, 0, 10), at::tensor({9, 0, 0, 3, 0, 2, 7, 2, 5, 5}, at::kLong));
  REQUIRE_EQUAL_TENSORS(test.labels.slice(0, 0, 10), at::tensor({9, 2, 1, 1, 6, 1, 4, 6, 5, 7}, at::kLong));
}

TEST_CASE("Fashion-MNIST normalization uses the training set's statistics", "[pipeline][data]") {
  FashionMnist raw = load_fashion_mnist(Split::Train, kDir, /*normalize=*/false);
  // Raw pixels /255; the first image's pixel sum from Python's gzip is 76247.
  REQUIRE(raw.images.min().item<float>() == 0.0f);
  REQUIRE(raw.images.max().item<float>() == 1.0f);
  REQUIRE(std::abs(raw.images[0].sum().item<double>() * 255.0 - 76247) < 0.1);  // float sum of 784 pixels
  // The constants are the training set's statistics to the 4 digits published
  // (float reductions over 47M pixels are accurate to ~1e-6 here).
  REQUIRE(std::abs(raw.images.mean().item<double>() - kFashionMnistMean) < 1e-3);
  REQUIRE(std::abs(raw.images.std().item<double>() - kFashionMnistStd) < 1e-3);
  // Normalized, the training set is about zero-mean and unit-variance
  // (margins: the constants' 4-digit rounding, divided by std).
  FashionMnist norm = load_fashion_mnist(Split::Train, kDir);
  REQUIRE(std::abs(norm.images.mean().item<double>()) < 3e-3);
  REQUIRE(std::abs(norm.images.std().item<double>() - 1) < 3e-3);
  // Float rounding of (x - mean) / std in either order: 1e-6 relative.
  REQUIRE_CLOSE(norm.images.slice(0, 0, 1000), (raw.images.slice(0, 0, 1000) - kFashionMnistMean) / kFashionMnistStd,
                1e-6, 1e-6);
}

TEST_CASE("a missing dataset names the path and the package", "[pipeline][data][errors]") {
  REQUIRE_THROWS_AS(load_fashion_mnist(Split::Train, "/nonexistent/fashion"), crucible::data::DataError);
  REQUIRE_THROWS_WITH(load_fashion_mnist(Split::Test, "/nonexistent/fashion"),
                      CRUCIBLE_HAS_SUBSTR("/nonexistent/fashion/t10k-images-idx3-ubyte.gz") &&
                          CRUCIBLE_HAS_SUBSTR("dataset-fashion-mnist"));
}

TEST_CASE("truncated, corrupt and non-IDX files are refused with the path", "[pipeline][data][errors]") {
  const std::string gz = read_bytes(kDir + "/t10k-labels-idx1-ubyte.gz");
  REQUIRE(gz.size() > 100);

  // Half of a gzip stream: zlib hits the end in the middle of the payload.
  fs::path truncated = temp_file("truncated-labels.gz", gz.substr(0, gz.size() / 2));
  REQUIRE_THROWS_WITH(read_idx(truncated.string()),
                      CRUCIBLE_HAS_SUBSTR(truncated.string()) && CRUCIBLE_HAS_SUBSTR("dataset-fashion-mnist"));

  // Flipped bytes in the compressed data: inflate or the CRC check fails.
  std::string flipped = gz;
  for (size_t i = gz.size() / 2; i < gz.size() / 2 + 16; ++i) flipped[i] = static_cast<char>(~flipped[i]);
  fs::path corrupt = temp_file("corrupt-labels.gz", flipped);
  REQUIRE_THROWS_WITH(read_idx(corrupt.string()),
                      CRUCIBLE_HAS_SUBSTR(corrupt.string()) && CRUCIBLE_HAS_SUBSTR("corrupt"));

  // A valid gzip stream whose content is not IDX.
  fs::path not_idx = temp_gz("not-idx.gz", "this is not an IDX file at all");
  REQUIRE_THROWS_WITH(read_idx(not_idx.string()),
                      CRUCIBLE_HAS_SUBSTR(not_idx.string()) && CRUCIBLE_HAS_SUBSTR("bad IDX magic number 0x74686973"));

  // An IDX header promising more bytes than follow.
  fs::path short_payload = temp_gz("short.gz", std::string("\x00\x00\x08\x01\x00\x00\x00\x10", 8) + "abc");
  REQUIRE_THROWS_WITH(read_idx(short_payload.string()), CRUCIBLE_HAS_SUBSTR("IDX payload"));

  // A well-formed file reads back: 1-D, 3 bytes.
  fs::path good = temp_gz("good.gz", std::string("\x00\x00\x08\x01\x00\x00\x00\x03", 8) + "abc");
  REQUIRE_EQUAL_TENSORS(read_idx(good.string()), at::tensor({97, 98, 99}, at::kByte));

  fs::remove_all(good.parent_path());
}
