// Where the pipeline tests read Fashion-MNIST: the directory meson's test()
// passes (the Debian package's, or a copy carried under .deps/sysroot), else
// the package's default.
#pragma once

#include <crucible/data/fashion_mnist.h>

#include <cstdlib>
#include <string>

inline std::string fashion_mnist_test_dir() {
  const char* dir = std::getenv("CRUCIBLE_FASHION_MNIST_DIR");
  return dir && *dir ? dir : crucible::data::kFashionMnistDir;
}
