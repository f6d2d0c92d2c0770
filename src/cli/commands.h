// `ultra` subcommands. Each takes the arguments after the program name (argv[0] is the subcommand) and
// returns the process exit code. Errors are printed as "error: <message>" and give a non-zero exit.
#pragma once

namespace ultra::cli {

int cmd_run(int argc, char** argv);
int cmd_bench(int argc, char** argv);
int cmd_convert(int argc, char** argv);
int cmd_quantize(int argc, char** argv);
int cmd_tokenize(int argc, char** argv);
int cmd_perplexity(int argc, char** argv);
int cmd_serve(int argc, char** argv);
int cmd_chat(int argc, char** argv);

}  // namespace ultra::cli
