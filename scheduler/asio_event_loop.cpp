#include "scheduler/asio_event_loop.hpp"

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <unordered_map>
#include <utility>

#include "kvtier/log.hpp"

namespace kvtier {

namespace asio = boost::asio;

namespace {

// The loop whose task this thread is running, if any (see "The turn" in the header).
thread_local const AsioEventLoop* loop_of_running_task = nullptr;

// The loop's turn: a flag taken by whoever runs a loop task. The loop thread waits for it (a
// futex wait through std::atomic::wait); run_sync only tries it. A flag and not a mutex because a
// task may hold every shard lock of the page table (its audit), and a lock more would pass the
// 64 locks one thread may hold under ThreadSanitizer; atomics order the tasks all the same.
class Turn {
 public:
  bool try_take() { return !taken_.exchange(true, std::memory_order_acquire); }
  void take() {
    while (taken_.exchange(true, std::memory_order_acquire)) {
      taken_.wait(true, std::memory_order_relaxed);
    }
  }
  void give_back() {
    taken_.store(false, std::memory_order_release);
    taken_.notify_one();
  }

 private:
  std::atomic<bool> taken_{false};
};

// Holds the turn for a scope, marking this thread as running `loop`'s task (the mark it found is
// restored: a task of one loop may run another's inline).
class TaskScope {
 public:
  // Waits for the turn (the loop thread).
  TaskScope(const AsioEventLoop* loop, Turn& turn) : TaskScope(loop, turn, std::adopt_lock) {
    turn_.take();
  }
  // The caller took the turn already (run_sync's try).
  TaskScope(const AsioEventLoop* loop, Turn& turn, std::adopt_lock_t)
      : turn_(turn), previous_(loop_of_running_task) {
    loop_of_running_task = loop;
  }
  ~TaskScope() {
    loop_of_running_task = previous_;
    turn_.give_back();
  }
  TaskScope(const TaskScope&) = delete;
  TaskScope& operator=(const TaskScope&) = delete;

 private:
  Turn& turn_;
  const AsioEventLoop* previous_;
};

// A task that throws is a bug in kvtier: its caller gets an internal error, not the exception.
Status run_catching(const std::function<Status()>& fn) {
  std::string what;
  try {
    return fn();
  } catch (const std::exception& e) {
    what = e.what();
  } catch (...) {
    what = "an exception of unknown type";
  }
  log(LogLevel::kError, "scheduler loop task threw: " + what);
  return internal_error("a scheduler loop task threw: " + what);
}

}  // namespace

struct AsioEventLoop::Impl {
  asio::io_context io;
  asio::executor_work_guard<asio::io_context::executor_type> work{io.get_executor()};
  std::thread thread;
  Turn turn;  // held by whoever runs a loop task
  // Tasks posted and not started: post() adds one; a task takes its own off as it starts, under
  // `turn`. Zero seen under `turn` means every task posted before has run to its end.
  std::atomic<uint64_t> queued{0};
  std::atomic<TimerId> next_timer{0};
  std::unordered_map<TimerId, std::unique_ptr<asio::steady_timer>> timers;  // under `turn`
};

Result<std::unique_ptr<AsioEventLoop>> AsioEventLoop::create() {
  auto impl = std::make_unique<Impl>();
  Impl* raw = impl.get();
  std::unique_ptr<AsioEventLoop> loop(new AsioEventLoop(std::move(impl)));
  raw->thread = std::thread([raw] {
    // A task that throws (a bug in kvtier; run_sync's tasks report it as a Status) is logged and
    // the loop kept alive rather than take the host process down.
    while (true) {
      try {
        raw->io.run();
        break;
      } catch (const std::exception& e) {
        log(LogLevel::kError, std::string("scheduler loop task threw: ") + e.what());
      }
    }
  });
  return loop;
}

AsioEventLoop::AsioEventLoop(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

AsioEventLoop::~AsioEventLoop() {
  if (!impl_->thread.joinable()) return;
  // Let already-posted tasks finish, then stop: cancel timers on the loop and drop the work guard.
  post([impl = impl_.get()] {
    for (auto& [id, timer] : impl->timers) timer->cancel();
    impl->timers.clear();
    impl->work.reset();
  });
  impl_->thread.join();
}

void AsioEventLoop::post(LoopTask task) {
  impl_->queued.fetch_add(1, std::memory_order_relaxed);
  asio::post(impl_->io, [this, task = std::move(task)] {
    TaskScope scope(this, impl_->turn);
    impl_->queued.fetch_sub(1, std::memory_order_release);
    task();
  });
}

TimerId AsioEventLoop::post_after(Nanos delay, LoopTask task) {
  const TimerId id = impl_->next_timer.fetch_add(1) + 1;
  post([this, id, delay, task = std::move(task)]() mutable {
    Impl* impl = impl_.get();
    auto timer = std::make_unique<asio::steady_timer>(impl->io);
    timer->expires_after(std::chrono::nanoseconds(delay > 0 ? delay : 0));
    timer->async_wait([this, id, task = std::move(task)](const boost::system::error_code& ec) {
      TaskScope scope(this, impl_->turn);
      impl_->timers.erase(id);
      if (!ec) task();
    });
    impl->timers.emplace(id, std::move(timer));
  });
  return id;
}

bool AsioEventLoop::cancel_timer(TimerId id) {
  if (!in_loop()) {
    // Hop to the loop; report whether the timer was still armed when the hop ran.
    bool cancelled = false;
    Status s = run_sync(
        [&] {
          cancelled = cancel_timer(id);
          return ok_status();
        },
        10 * kNanosPerSecond);
    return s.ok() && cancelled;
  }
  auto it = impl_->timers.find(id);
  if (it == impl_->timers.end()) return false;
  it->second->cancel();  // its handler runs with operation_aborted and erases the entry
  return true;
}

bool AsioEventLoop::in_loop() const { return loop_of_running_task == this; }

Status AsioEventLoop::run_sync(std::function<Status()> fn, Nanos timeout) {
  if (in_loop()) return run_catching(fn);
  // The loop is idle and nothing is queued before this call: run it here (see the header).
  if (impl_->turn.try_take()) {
    TaskScope scope(this, impl_->turn, std::adopt_lock);
    if (impl_->queued.load(std::memory_order_acquire) == 0) return run_catching(fn);
  }
  return hand_off(std::move(fn), timeout);
}

Status AsioEventLoop::run_on_loop_thread(std::function<Status()> fn, Nanos timeout) {
  if (in_loop()) return run_catching(fn);
  return hand_off(std::move(fn), timeout);
}

Status AsioEventLoop::hand_off(std::function<Status()> fn, Nanos timeout) {
  struct Call {
    std::mutex mu;
    std::condition_variable cv;
    bool started = false;
    bool abandoned = false;
    bool done = false;
    Status result;
  };
  auto call = std::make_shared<Call>();
  post([call, fn = std::move(fn)] {
    {
      std::lock_guard<std::mutex> lock(call->mu);
      if (call->abandoned) return;
      call->started = true;
    }
    Status s = run_catching(fn);
    {
      std::lock_guard<std::mutex> lock(call->mu);
      call->result = std::move(s);
      call->done = true;
    }
    call->cv.notify_all();
  });
  std::unique_lock<std::mutex> lock(call->mu);
  if (!call->cv.wait_for(lock, std::chrono::nanoseconds(timeout), [&] { return call->started; })) {
    call->abandoned = true;
    return deadline_exceeded("the scheduler loop did not take the call within " +
                             std::to_string(timeout / kNanosPerMilli) + " ms");
  }
  call->cv.wait(lock, [&] { return call->done; });
  return std::move(call->result);
}

}  // namespace kvtier
