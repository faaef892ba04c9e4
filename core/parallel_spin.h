// The thread pool's polling between jobs (core/parallel.cpp), for tests and diagnostics.
#pragma once
#include <cstdint>

namespace ember::detail {

// EMBER_SPIN_US's text as microseconds (a whole number), or an ember::Error naming the variable.
int64_t parse_spin_microseconds(const char* text);
// The pool's polling time in microseconds from now on, or -1 for the default again.
void set_spin_microseconds(int64_t us);
// The polling time in effect, in microseconds.
int64_t spin_microseconds();
// How many jobs so far found a worker asleep and had to wake it.
int64_t pool_wakeups();

}  // namespace ember::detail
