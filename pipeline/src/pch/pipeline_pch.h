// Precompiled header for the pipeline library: ATen dominates every source's parse time.
#include <ATen/ATen.h>
