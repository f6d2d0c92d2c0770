// Runs the built `ultra` command (ULTRA_ULTRA_BIN) as a user does: a child process, no shell, its standard
// output and error captured. The tests of the subcommands go through it rather than calling the command's
// functions, so that they see exactly what a user sees (main()'s "error: ..." line and exit status included).
#pragma once

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "tmp_dir.h"

namespace ultra::test {

struct UltraRun {
  int status = -1;  // the exit status; 128 + the signal's number when a signal ended it
  std::string out, err;
};

// args: what follows `ultra` (the subcommand first).
inline UltraRun run_ultra(const std::vector<std::string>& args) {
  const TmpDir dir("ultra_run");
  const std::string out_path = dir.file("stdout"), err_path = dir.file("stderr");
  std::vector<std::string> a = {"ultra"};
  a.insert(a.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& s : a) argv.push_back(s.data());
  argv.push_back(nullptr);
  UltraRun r;
  const int fo = open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  const int fe = open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fo < 0 || fe < 0) return r;
  const pid_t pid = fork();
  if (pid == 0) {  // only async-signal-safe calls from here on
    dup2(fo, 1);
    dup2(fe, 2);
    execv(ULTRA_ULTRA_BIN, argv.data());
    _exit(127);
  }
  close(fo);
  close(fe);
  int st = 0;
  if (pid < 0 || waitpid(pid, &st, 0) != pid) return r;
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  std::ifstream o(out_path, std::ios::binary), e(err_path, std::ios::binary);
  r.out.assign(std::istreambuf_iterator<char>(o), {});
  r.err.assign(std::istreambuf_iterator<char>(e), {});
  return r;
}

}  // namespace ultra::test
