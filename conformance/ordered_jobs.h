// RunOrdered: runs independent jobs 0..n-1 on up to `jobs` worker threads and hands their
// results to the calling thread in index order, each as soon as it and every job before it are
// done. The runner uses it to run several cases at once while the table stays in plan order.
//
// `work(i)` runs on a worker thread (on the calling thread when jobs <= 1) and must be safe to
// call concurrently for different i; it returns std::nullopt for a job it declines to run (the
// run was interrupted). `deliver(i, result)` runs on the calling thread only, in order. An
// exception thrown by work(i) (when job i's turn to be delivered comes) or by deliver is
// rethrown by RunOrdered after the workers have stopped taking jobs and finished theirs.
//
// Thread-safety: RunOrdered itself may be called from any thread; it owns its workers and
// joins them before returning.
#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

namespace fsdp::conformance {

template <typename T>
void RunOrdered(size_t n, int jobs, const std::function<std::optional<T>(size_t)>& work,
                const std::function<void(size_t, std::optional<T>)>& deliver) {
  if (jobs <= 1 || n <= 1) {
    for (size_t i = 0; i < n; ++i) deliver(i, work(i));
    return;
  }
  struct Slot {
    bool done = false;
    std::optional<T> result;
    std::exception_ptr error;
  };
  std::vector<Slot> slots(n);
  std::mutex mu;
  std::condition_variable cv;
  std::atomic<size_t> next{0};
  std::atomic<bool> stop{false};  // a job threw, or delivery ended: take no further jobs
  const size_t threads = std::min(n, static_cast<size_t>(jobs));
  size_t alive = threads;  // workers still running (guarded by mu)
  std::vector<std::thread> workers;
  workers.reserve(threads);
  for (size_t t = 0; t < threads; ++t) {
    workers.emplace_back([&] {
      for (size_t i = next++; i < n && !stop; i = next++) {
        Slot slot;
        try {
          slot.result = work(i);
        } catch (...) {
          slot.error = std::current_exception();
          stop = true;
        }
        slot.done = true;
        {
          std::lock_guard<std::mutex> lock(mu);
          slots[i] = std::move(slot);
        }
        cv.notify_all();
      }
      {
        std::lock_guard<std::mutex> lock(mu);
        --alive;
      }
      cv.notify_all();
    });
  }
  std::exception_ptr error;
  for (size_t i = 0; i < n; ++i) {
    std::unique_lock<std::mutex> lock(mu);
    // Every worker gone with job i not done: nobody took it (they stopped after an exception).
    cv.wait(lock, [&] { return slots[i].done || alive == 0; });
    if (!slots[i].done) break;
    Slot slot = std::move(slots[i]);
    lock.unlock();
    if (slot.error) {
      error = slot.error;
      break;
    }
    try {
      deliver(i, std::move(slot.result));
    } catch (...) {
      error = std::current_exception();
      break;
    }
  }
  stop = true;
  for (auto& w : workers) w.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace fsdp::conformance
