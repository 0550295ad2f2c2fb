// The job lists of the product launchers: a launch takes its jobs as one kernel parameter of at
// most kMaxMatvecJobs, so a longer request is several launches.
#pragma once
#include <algorithm>

#include "cuda/kernels.h"

namespace rl::cuda {

// For each list of up to kMaxMatvecJobs of jobs[0..n), in order: check(job) on each, then, when
// one of them has rows, launch(list, m, max_rows) (List holds `job[kMaxMatvecJobs]`; m jobs in
// it, max_rows the most rows of any).
template <class List, class Job, class Check, class Launch>
void for_each_job_list(const Job* jobs, int n, Check&& check, Launch&& launch) {
  for (int j0 = 0; j0 < n; j0 += kMaxMatvecJobs) {
    const int m = std::min(n - j0, kMaxMatvecJobs);
    List list{};
    int max_rows = 0;
    for (int j = 0; j < m; j++) {
      check(jobs[j0 + j]);
      list.job[j] = jobs[j0 + j];
      max_rows = std::max(max_rows, jobs[j0 + j].rows);
    }
    if (max_rows > 0) launch(list, m, max_rows);
  }
}

}  // namespace rl::cuda
