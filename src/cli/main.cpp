// ultra: command-line entry point. `ultra SUBCOMMAND [flags]`; see `ultra --help`.
#include <fmt/format.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string_view>
#include <utility>

#include "cli/commands.h"
#include "cli/common.h"
#include "ultra/error.h"

namespace {

struct Command {
  const char* name;
  int (*fn)(int, char**);
  const char* help;
};

const Command kCommands[] = {
    {"run", ultra::cli::cmd_run, "generate text from a prompt"},
    {"chat", ultra::cli::cmd_chat, "interactive chat in the terminal on the model's chat template"},
    {"bench", ultra::cli::cmd_bench, "measure prompt processing and generation speed (llama-bench style)"},
    {"convert", ultra::cli::cmd_convert, "convert an HF model directory to GGUF"},
    {"quantize", ultra::cli::cmd_quantize,
     "quantize a GGUF file or HF directory (llama.cpp's mixes q4_k_m, q6_k, iq4_xs, ...; fp8, ternary, "
     "q8_0)"},
    {"tokenize", ultra::cli::cmd_tokenize, "print the token ids and pieces of a text"},
    {"perplexity", ultra::cli::cmd_perplexity, "perplexity of a text file (llama.cpp-style)"},
    {"serve", ultra::cli::cmd_serve, "OpenAI-compatible HTTP server with continuous batching"},
};

// llama.cpp's multi-letter single-dash flags, which the flag parser takes only in their long form.
const std::pair<const char*, const char*> kAliases[] = {
    {"-ngl", "--n-gpu-layers"}, {"-md", "--model-draft"}, {"-np", "--parallel"}};

void usage(FILE* f) {
  std::fprintf(f, "usage: ultra COMMAND [options]\n\ncommands:\n");
  for (const auto& c : kCommands) std::fprintf(f, "  %-10s %s\n", c.name, c.help);
  std::fprintf(f, "\n`ultra COMMAND --help` lists a command's options.\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  const std::string_view cmd = argv[1];
  if (cmd == "-h" || cmd == "--help" || cmd == "help") {
    usage(stdout);
    if (std::fflush(stdout) != 0 || std::ferror(stdout)) {
      fmt::print(stderr, "error: standard output: write failed: {}\n", std::strerror(errno));
      return 1;
    }
    return 0;
  }
  for (int i = 2; i < argc; ++i)
    for (const auto& [from, to] : kAliases)
      if (std::strcmp(argv[i], from) == 0) argv[i] = const_cast<char*>(to);
  for (const auto& c : kCommands) {
    if (cmd == c.name) {
      try {
        const int rc = c.fn(argc - 1, argv + 1);
        ultra::cli::flush_stdout();  // a write error still buffered (e.g. `> /dev/full`) is an error too
        return rc;
      } catch (const ultra::Error& e) {
        // --tp: an error every rank meets alike is printed by rank 0, whose exit status ends the job; the
        // other ranks end quietly with 0 (mpirun ends the job at the first non-zero exit, which could come
        // before rank 0 has printed).
        if (e.rank0_reports()) return 0;
        fmt::print(stderr, "error: {}\n", e.what());
        return 1;
      } catch (const std::bad_alloc&) {
        fmt::print(stderr, "error: out of memory\n");
        return 1;
      } catch (const std::exception& e) {
        fmt::print(stderr, "error: {}\n", e.what());
        return 1;
      }
    }
  }
  fmt::print(stderr, "error: unknown command '{}'\n", cmd);
  usage(stderr);
  return 2;
}
