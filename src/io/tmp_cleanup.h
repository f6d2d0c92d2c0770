// Temporary output files removed when the process is ended by a signal.
//
// gguf::Writer writes under a hidden temporary name and renames it at the end; an exception removes it,
// but SIGINT / SIGTERM / SIGHUP would end the process with the file (up to a model's size) left behind. A
// writer registers its temporary path here while it exists; a program that installs the handlers
// (install_tmp_cleanup_on_signals(), or the public remove_partial_output_on_signals(), as `ultra convert` and
// `ultra quantize` do) gets every registered path unlinked from the handler, which then restores the default
// action and re-raises the signal, so the exit status still says which signal ended the process. Only
// async-signal-safe calls run in the handler (unlink, sigaction, raise); the paths live in a fixed table of
// slots. SIGKILL cannot be caught.
#pragma once

#include <signal.h>

namespace ultra::io {

// Registers path (copied; at most kTmpPathMax - 1 bytes) for removal on a signal. Returns the slot to
// pass to unregister_tmp, or -1 when the table is full or the path too long (the file is then not removed
// on a signal; nothing else changes).
int register_tmp(const char* path);
// Ends the registration (after the file was renamed or removed). -1 is ignored.
void unregister_tmp(int slot);

// Blocks SIGINT, SIGTERM and SIGHUP in the calling thread for its lifetime (a signal arriving meanwhile is
// delivered at the end): around creating a temporary file and registering it, so that no signal finds the
// file created but not yet registered.
class SignalBlock {
 public:
  SignalBlock();
  ~SignalBlock();
  SignalBlock(const SignalBlock&) = delete;
  SignalBlock& operator=(const SignalBlock&) = delete;

 private:
  sigset_t old_;
};

// Installs the handlers for SIGINT, SIGTERM and SIGHUP (once; later calls do nothing). A signal that was
// ignored when the program started stays ignored.
void install_tmp_cleanup_on_signals();

inline constexpr int kTmpPathMax = 4096;

}  // namespace ultra::io
