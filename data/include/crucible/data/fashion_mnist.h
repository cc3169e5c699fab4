// Fashion-MNIST from Debian's `dataset-fashion-mnist` package: gzip'd IDX
// files read with zlib, parsed, and normalized into ready-to-train tensors.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>

namespace crucible::data {

/// Where Debian's `dataset-fashion-mnist` package installs the four files.
inline constexpr const char* kFashionMnistDir = "/usr/share/datasets/fashion-mnist";

/// Mean and standard deviation of the training images' pixels scaled to
/// [0, 1], the constants the Fashion-MNIST literature normalizes with (the
/// tests recompute them from the files and check them to 1e-3).
inline constexpr double kFashionMnistMean = 0.2860;
inline constexpr double kFashionMnistStd = 0.3530;

/// Reads one IDX file (gzip'd or not; zlib reads plain files through) into a
/// uint8 tensor whose sizes are the file's dimensions. Only unsigned-byte
/// payloads (type code 0x08) are accepted, which is what the MNIST family uses.
/// Throws DataError naming `path` when the file is missing, truncated or
/// not gzip/IDX (bad magic, sizes that disagree with the payload).
at::Tensor read_idx(const std::string& path);

enum class Split { Train, Test };

/// One split of Fashion-MNIST.
struct FashionMnist {
  at::Tensor images;  ///< float32 [N, 1, 28, 28]; (pixel/255 - mean) / std, or pixel/255 unnormalized
  at::Tensor labels;  ///< int64 [N], class indices 0..9
};

/// Loads a split (N = 60000 for Train, 10000 for Test) from `dir`, which
/// holds {train,t10k}-{images-idx3,labels-idx1}-ubyte.gz. With `normalize`,
/// images are standardized with kFashionMnistMean/kFashionMnistStd.
/// Throws DataError naming the file and the package to install when a
/// file is missing or corrupt, or when the image and label counts disagree.
FashionMnist load_fashion_mnist(Split split, const std::string& dir = kFashionMnistDir, bool normalize = true);

}  // namespace crucible::data
