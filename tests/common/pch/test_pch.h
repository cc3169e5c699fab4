// Precompiled header for the test suites: ATen and Catch2 dominate their parse time.
#include <ATen/ATen.h>

#include "../catch.h"
