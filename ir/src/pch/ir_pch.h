// Precompiled header for the ir library: the c10/ATen core headers every
// source of it includes (about 6 s of parsing per file without it).
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>
