#include <cstdio>

int main(int argc, char** argv) {
  std::puts("ultra: no subcommands yet");
  return 0;
}
