#include <crucible/data/error.h>
#include <crucible/data/fashion_mnist.h>

#include <ATen/ATen.h>
#include <zlib.h>

#include <sys/stat.h>
#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

namespace crucible::data {
namespace {

std::string install_hint() {
  return " (Fashion-MNIST comes from Debian's `dataset-fashion-mnist` package: "
         "apt-get install dataset-fashion-mnist, which ./x does)";
}

[[noreturn]] void fail(const std::string& path, const std::string& why) {
  throw DataError("cannot read " + path + ": " + why + install_hint());
}

struct GzCloser {
  void operator()(gzFile f) const { gzclose(f); }
};
using GzHandle = std::unique_ptr<std::remove_pointer_t<gzFile>, GzCloser>;

// Reads exactly `n` bytes or throws; zlib reports truncation and bad
// compressed data through gzerror.
void read_exact(gzFile f, const std::string& path, void* dst, size_t n, const char* what) {
  auto* out = static_cast<unsigned char*>(dst);
  while (n > 0) {
    const unsigned chunk = static_cast<unsigned>(std::min<size_t>(n, 1u << 30));
    const int got = gzread(f, out, chunk);
    if (got <= 0) {
      int code = Z_OK;
      const char* msg = gzerror(f, &code);
      fail(path, std::string("the file ends or is corrupt while reading its ") + what +
                     (code != Z_OK && msg && *msg ? std::string(" (zlib: ") + msg + ")" : std::string()));
    }
    out += got;
    n -= static_cast<size_t>(got);
  }
}

uint32_t big_endian(const unsigned char* b) {
  return (uint32_t(b[0]) << 24) | (uint32_t(b[1]) << 16) | (uint32_t(b[2]) << 8) | uint32_t(b[3]);
}

}  // namespace

at::Tensor read_idx(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) fail(path, std::strerror(errno));
  GzHandle f(gzopen(path.c_str(), "rb"));
  if (!f) fail(path, "gzopen failed");

  // IDX header: two zero bytes, the element type, the number of dimensions,
  // then one big-endian uint32 size per dimension.
  std::array<unsigned char, 4> magic{};
  read_exact(f.get(), path, magic.data(), magic.size(), "IDX magic number");
  if (magic[0] != 0 || magic[1] != 0 || magic[2] != 0x08 || magic[3] == 0 || magic[3] > 4) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "bad IDX magic number 0x%02x%02x%02x%02x", magic[0], magic[1], magic[2], magic[3]);
    fail(path, std::string(buf) + ", expected 0x000008NN (unsigned bytes, NN = 1..4 dimensions)");
  }
  std::vector<int64_t> sizes(magic[3]);
  int64_t numel = 1;
  for (auto& s : sizes) {
    std::array<unsigned char, 4> b{};
    read_exact(f.get(), path, b.data(), b.size(), "IDX dimension sizes");
    s = big_endian(b.data());
    numel *= s;
  }
  // Refuse sizes the file cannot hold before allocating for them.
  if (numel > (int64_t(1) << 32)) fail(path, "IDX sizes claim " + std::to_string(numel) + " elements");

  at::Tensor data = at::empty(sizes, at::kByte);
  read_exact(f.get(), path, data.data_ptr<uint8_t>(), static_cast<size_t>(numel), "IDX payload");
  // Reading past the payload also makes zlib check the gzip trailer (CRC and length).
  unsigned char extra;
  const int more = gzread(f.get(), &extra, 1);
  if (more < 0) {
    int code = Z_OK;
    fail(path, std::string("corrupt gzip data (zlib: ") + gzerror(f.get(), &code) + ")");
  }
  if (more > 0) fail(path, "trailing data after the IDX payload (its sizes disagree with the file)");
  return data;
}

FashionMnist load_fashion_mnist(Split split, const std::string& dir, bool normalize) {
  const std::string prefix = dir + "/" + (split == Split::Train ? "train" : "t10k");
  const std::string images_path = prefix + "-images-idx3-ubyte.gz";
  const std::string labels_path = prefix + "-labels-idx1-ubyte.gz";
  at::Tensor images = read_idx(images_path);
  at::Tensor labels = read_idx(labels_path);
  if (images.dim() != 3 || images.size(1) != 28 || images.size(2) != 28)
    fail(images_path, "expected N x 28 x 28 images, found sizes " + c10::str(images.sizes()));
  if (labels.dim() != 1 || labels.size(0) != images.size(0))
    fail(labels_path, "expected " + std::to_string(images.size(0)) + " labels (one per image in " + images_path +
                          "), found sizes " + c10::str(labels.sizes()));
  if (labels.max().item<int64_t>() > 9) fail(labels_path, "labels outside 0..9");

  at::Tensor x = images.to(at::kFloat).div_(255.0).unsqueeze(1);
  if (normalize) x.sub_(kFashionMnistMean).div_(kFashionMnistStd);
  return {x.contiguous(), labels.to(at::kLong)};
}

}  // namespace crucible::data
