// Precompiled header for the test suites: ATen and Catch2 dominate their parse time.
// Only suites of two files or more use it: on 2 cores building it takes about
// 70 s and saves about 34 s a file (57 s without, 23 s with), so a one-file
// suite compiles faster without.
#include <ATen/ATen.h>

#include "../catch.h"
