// The gate between the Python module's calls and its shutdown (runtime/python/call_gate.hpp): a
// call that arrives while a shutdown decides waits for the decision and goes ahead when it is
// refused; a shutdown waits only for the calls in progress and is not starved by new ones; a call
// made inside a call on one thread is let in at once. Threads are ordered by what the gate shows
// (deciding, a wait begun), never by sleeping; the stress case also runs under TSan.
#include "runtime/python/call_gate.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <optional>
#include <stdexcept>
#include <thread>
#include <vector>

namespace kvtier::python {
namespace {

void spin_until_either(const std::atomic<bool>& a, const std::atomic<bool>& b) {
  while (!a.load() && !b.load()) std::this_thread::yield();
}

void spin_until_deciding(const CallGate& gate) {
  while (!gate.deciding()) std::this_thread::yield();
}

// A wait_with that says when a wait begins, then waits.
struct RecordingWait {
  std::atomic<bool>* began;
  template <typename Fn>
  void operator()(Fn&& wait) const {
    began->store(true);
    wait();
  }
};

const auto kDirect = [](auto&& wait) { wait(); };
const auto kMustNotWait = [](auto&&) { throw std::runtime_error("the call would have waited"); };

// One call held on the main thread while a shutdown decides on another; a third thread calls.
// Returns whether that call was admitted, after the shutdown decided (commit or refuse).
bool call_during_a_decision(bool commit, bool* call_waited) {
  CallGate gate;
  std::optional<CallGate::Call> held = gate.enter(kDirect);
  EXPECT_TRUE(held.has_value());
  std::atomic<bool> decided{false};
  std::thread shutdown([&] {
    CallGate::Closing closing(gate);  // waits for `held`
    EXPECT_FALSE(closing.already_shut());
    // Said before the gate tells anyone: commit() wakes the waiting call at once (a refusal, when
    // `closing` ends), so a flag set after it could come late.
    decided = true;
    if (commit) closing.commit();
  });
  spin_until_deciding(gate);
  std::atomic<bool> began{false};
  std::atomic<bool> returned{false};
  std::optional<bool> admitted;
  std::thread caller([&] {
    std::optional<CallGate::Call> call = gate.enter(RecordingWait{&began});
    EXPECT_TRUE(decided.load()) << "a call returned before the deciding shutdown decided";
    admitted = call.has_value();
    returned = true;
  });
  spin_until_either(began, returned);  // the caller waits for the decision, not failing at once
  EXPECT_FALSE(decided.load()) << "the shutdown did not wait for the call in progress";
  held.reset();
  shutdown.join();
  caller.join();
  *call_waited = began.load();
  EXPECT_EQ(gate.shut_down(), commit);
  return admitted.value_or(false);
}

TEST(CallGate, ACallArrivingWhileAShutdownDecidesGoesAheadWhenTheShutdownIsRefused) {
  bool waited = false;
  EXPECT_TRUE(call_during_a_decision(/*commit=*/false, &waited));
  EXPECT_TRUE(waited);
}

TEST(CallGate, ACallArrivingWhileAShutdownDecidesFailsWhenTheShutdownGoesThrough) {
  bool waited = false;
  EXPECT_FALSE(call_during_a_decision(/*commit=*/true, &waited));
  EXPECT_TRUE(waited);
}

TEST(CallGate, EveryCallFailsAtOnceOnceShutAndALaterShutdownFindsNothingToDecide) {
  CallGate gate;
  {
    CallGate::Closing closing(gate);
    closing.commit();
  }
  EXPECT_TRUE(gate.shut_down());
  EXPECT_FALSE(gate.deciding());
  std::atomic<bool> began{false};
  EXPECT_FALSE(gate.enter(RecordingWait{&began}).has_value());
  EXPECT_FALSE(began.load());
  CallGate::Closing again(gate);
  EXPECT_TRUE(again.already_shut());
}

TEST(CallGate, ACallInsideACallOnOneThreadIsLetInWhileAShutdownDecides) {
  CallGate gate;
  std::optional<CallGate::Call> outer = gate.enter(kDirect);
  ASSERT_TRUE(outer.has_value());
  std::thread shutdown([&] {
    CallGate::Closing closing(gate);
    closing.commit();
  });
  spin_until_deciding(gate);
  // Waiting here would deadlock: the shutdown waits for `outer`, held by this thread.
  bool admitted = false;
  EXPECT_NO_THROW(admitted = gate.enter(kMustNotWait).has_value());
  EXPECT_TRUE(admitted);
  EXPECT_FALSE(gate.shut_down());
  outer.reset();
  shutdown.join();
  EXPECT_TRUE(gate.shut_down());
  // The thread holds no call any more: it is not let in past a shut gate.
  EXPECT_FALSE(gate.enter(kDirect).has_value());
}

TEST(CallGate, AMovedCallIsReleasedOnceAndCountsAsHeldUntilThen) {
  CallGate gate;
  std::optional<CallGate::Call> first = gate.enter(kDirect);
  ASSERT_TRUE(first.has_value());
  CallGate::Call moved(std::move(*first));
  first.reset();  // the moved-from call releases nothing
  std::thread shutdown([&] {
    CallGate::Closing closing(gate);
    closing.commit();
  });
  spin_until_deciding(gate);
  EXPECT_FALSE(gate.shut_down());  // `moved` still holds the gate open
  bool admitted = false;           // still inside `moved`
  EXPECT_NO_THROW(admitted = gate.enter(kMustNotWait).has_value());
  EXPECT_TRUE(admitted);
  { CallGate::Call done(std::move(moved)); }
  shutdown.join();
  EXPECT_TRUE(gate.shut_down());
}

// Callers enter and leave as fast as they can while shutdowns decide and are refused, each among
// calls in progress, then one goes through: no call fails before that one was raised, each
// refused shutdown got in (it was not starved), and after it every call fails.
TEST(CallGate, StressRefusedShutdownsFailNoCallAndAreNotStarved) {
  CallGate gate;
  constexpr int kCallers = 4;
  constexpr int kRefusals = 200;
  std::atomic<bool> final_raised{false};
  std::atomic<int> early_failures{0};
  std::atomic<long> calls{0};
  std::vector<std::thread> callers;
  for (int i = 0; i < kCallers; ++i) {
    callers.emplace_back([&] {
      for (;;) {
        std::optional<CallGate::Call> call = gate.enter(kDirect);
        if (!call) {
          if (!final_raised.load()) early_failures.fetch_add(1);
          return;
        }
        calls.fetch_add(1, std::memory_order_relaxed);
      }
    });
  }
  for (int i = 0; i < kRefusals; ++i) {
    // Each refusal meets callers at work: some call went through since the last one.
    const long before = calls.load();
    while (calls.load() == before) std::this_thread::yield();
    CallGate::Closing refused(gate);
    EXPECT_FALSE(refused.already_shut());
  }
  final_raised = true;
  {
    CallGate::Closing closing(gate);
    closing.commit();
  }
  for (std::thread& t : callers) t.join();
  EXPECT_EQ(early_failures.load(), 0);
  EXPECT_GE(calls.load(), kRefusals);
  EXPECT_TRUE(gate.shut_down());
}

}  // namespace
}  // namespace kvtier::python
