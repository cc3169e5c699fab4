// Trains a packaged training step without the compiler: loads the package a
// `crucible export` (or pipeline::export_train_step) wrote, runs 10 steps on
// the example batch saved in it, and prints the load time and each step's
// loss and time. Links only
// crucible-loader (and through it LibTorch and Crucible's run-time
// libraries):
//
//   crucible export --model mlp --out /tmp/mlp_step
//   exported_train_step /tmp/mlp_step
#include <crucible/loader/train_step.h>

#include <c10/util/Exception.h>

#include <chrono>
#include <exception>
#include <iostream>

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: " << argv[0] << " PACKAGE_DIR\n";
    return 2;
  }
  using Clock = std::chrono::steady_clock;
  auto ms_since = [](Clock::time_point start) {
    return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  };
  try {
    const Clock::time_point start = Clock::now();
    const crucible::LoadedTrainStep step = crucible::load_train_step(argv[1]);
    std::cout << "loaded " << argv[1] << " in " << ms_since(start) << " ms\n";
    for (int i = 0; i < 10; ++i) {
      const Clock::time_point begin = Clock::now();
      const double loss = step(step.example_batch()).item<double>();
      std::cout << "step " << i << " loss " << loss << " (" << ms_since(begin) << " ms)\n";
    }
  } catch (const c10::Error& e) {
    std::cerr << "exported_train_step: " << e.what_without_backtrace() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "exported_train_step: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
