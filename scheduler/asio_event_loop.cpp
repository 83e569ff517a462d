#include "scheduler/asio_event_loop.hpp"

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <condition_variable>
#include <future>
#include <mutex>
#include <unordered_map>

#include "kvtier/log.hpp"

namespace kvtier {

namespace asio = boost::asio;

struct AsioEventLoop::Impl {
  asio::io_context io;
  asio::executor_work_guard<asio::io_context::executor_type> work{io.get_executor()};
  std::thread thread;
  std::atomic<std::thread::id> loop_thread_id{};
  std::atomic<TimerId> next_timer{0};
  std::unordered_map<TimerId, std::unique_ptr<asio::steady_timer>> timers;  // loop thread only
};

Result<std::unique_ptr<AsioEventLoop>> AsioEventLoop::create() {
  auto impl = std::make_unique<Impl>();
  Impl* raw = impl.get();
  std::unique_ptr<AsioEventLoop> loop(new AsioEventLoop(std::move(impl)));
  // The thread announces its id before the first task can run; a promise (not a condition
  // variable on this stack frame) so the announcement outlives this function's return.
  std::promise<void> started;
  std::future<void> running = started.get_future();
  raw->thread = std::thread([raw, started = std::move(started)]() mutable {
    raw->loop_thread_id.store(std::this_thread::get_id());
    started.set_value();
    // Loop tasks report errors through Status; an exception escaping one is a bug in kvtier. Log it
    // and keep the loop alive rather than take the host process down.
    while (true) {
      try {
        raw->io.run();
        break;
      } catch (const std::exception& e) {
        log(LogLevel::kError, std::string("scheduler loop task threw: ") + e.what());
      }
    }
  });
  running.wait();
  return loop;
}

AsioEventLoop::AsioEventLoop(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

AsioEventLoop::~AsioEventLoop() {
  if (!impl_->thread.joinable()) return;
  // Let already-posted tasks finish, then stop: cancel timers on the loop and drop the work guard.
  asio::post(impl_->io, [impl = impl_.get()] {
    for (auto& [id, timer] : impl->timers) timer->cancel();
    impl->timers.clear();
    impl->work.reset();
  });
  impl_->thread.join();
}

void AsioEventLoop::post(LoopTask task) { asio::post(impl_->io, std::move(task)); }

TimerId AsioEventLoop::post_after(Nanos delay, LoopTask task) {
  const TimerId id = impl_->next_timer.fetch_add(1) + 1;
  asio::post(impl_->io, [impl = impl_.get(), id, delay, task = std::move(task)]() mutable {
    auto timer = std::make_unique<asio::steady_timer>(impl->io);
    timer->expires_after(std::chrono::nanoseconds(delay > 0 ? delay : 0));
    timer->async_wait([impl, id, task = std::move(task)](const boost::system::error_code& ec) {
      impl->timers.erase(id);
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

bool AsioEventLoop::in_loop() const {
  return impl_->loop_thread_id.load() == std::this_thread::get_id();
}

Status AsioEventLoop::run_sync(std::function<Status()> fn, Nanos timeout) {
  if (in_loop()) return fn();
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
    Status s = fn();
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
