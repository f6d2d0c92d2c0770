#include "io/tmp_cleanup.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstring>

#include "ultra/convert.h"

namespace ultra::io {

namespace {

constexpr int kSlots = 16;

// A slot is claimed (state 1) while its path is copied in, then published (state 2); the handler unlinks
// only published paths. Lock-free atomics are async-signal-safe.
struct Slot {
  std::atomic<int> state{0};  // 0 free, 1 being filled, 2 registered
  char path[kTmpPathMax];
};
Slot g_slots[kSlots];
static_assert(std::atomic<int>::is_always_lock_free);

std::atomic<bool> g_installed{false};

void on_signal(int sig) {
  for (Slot& s : g_slots)
    if (s.state.load(std::memory_order_acquire) == 2) ::unlink(s.path);
  struct sigaction sa {};
  sa.sa_handler = SIG_DFL;
  sigemptyset(&sa.sa_mask);
  ::sigaction(sig, &sa, nullptr);
  ::raise(sig);  // blocked while this handler runs; delivered with the default action when it returns
}

}  // namespace

int register_tmp(const char* path) {
  const size_t n = std::strlen(path);
  if (n >= (size_t)kTmpPathMax) return -1;
  for (int i = 0; i < kSlots; ++i) {
    int expected = 0;
    if (!g_slots[i].state.compare_exchange_strong(expected, 1, std::memory_order_acquire)) continue;
    std::memcpy(g_slots[i].path, path, n + 1);
    g_slots[i].state.store(2, std::memory_order_release);
    return i;
  }
  return -1;
}

void unregister_tmp(int slot) {
  if (slot >= 0 && slot < kSlots) g_slots[slot].state.store(0, std::memory_order_release);
}

SignalBlock::SignalBlock() {
  sigset_t set;
  sigemptyset(&set);
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) sigaddset(&set, sig);
  ::pthread_sigmask(SIG_BLOCK, &set, &old_);
}

SignalBlock::~SignalBlock() {
  ::pthread_sigmask(SIG_SETMASK, &old_, nullptr);
}

void install_tmp_cleanup_on_signals() {
  if (g_installed.exchange(true)) return;
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) {
    struct sigaction old {};
    ::sigaction(sig, nullptr, &old);
    if (old.sa_handler == SIG_IGN) continue;  // e.g. nohup: leave it ignored
    struct sigaction sa {};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    ::sigaction(sig, &sa, nullptr);
  }
}

}  // namespace ultra::io

namespace ultra {

void remove_partial_output_on_signals() {
  io::install_tmp_cleanup_on_signals();
}

}  // namespace ultra
