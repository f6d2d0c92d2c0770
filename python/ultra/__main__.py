"""python -m ultra run|serve|... : the `ultra` command with the same arguments.

The command is looked for in $ULTRA_BIN, then beside the package (ultra/bin/ultra: `pip install` puts the
one it built there, and the build tree links it there), then on PATH.
"""

import os
import shutil
import sys


def ultra_binary() -> str:
    env = os.environ.get("ULTRA_BIN")
    if env:
        return env
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin", "ultra")
    if os.path.isfile(here) and os.access(here, os.X_OK):
        return here
    found = shutil.which("ultra")
    if found:
        return found
    raise SystemExit("python -m ultra: the `ultra` command was found neither beside the package "
                     f"({here}) nor on PATH; set ULTRA_BIN")


def main(argv=None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print("usage: python -m ultra {run,serve,chat,...} [ARGS]  (the `ultra` command's subcommands)")
        return 0 if args else 2
    exe = ultra_binary()
    os.execv(exe, [exe] + args)  # the command replaces this process: its exit status, signals and output


if __name__ == "__main__":
    sys.exit(main())
