// How many CPUs this process may run on: what sizes the thread pool's polling and `ember
// launch`'s threads per rank.
#pragma once

namespace ember {

// The CPUs in this process's affinity mask (taskset, cgroup cpusets, Slurm), else the online
// CPUs; at least 1.
int usable_cpus();

}  // namespace ember
