// Precompiled header for the tracer library: ATen's full operator API, which
// most of its sources use to run or decompose ops.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
