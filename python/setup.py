"""Builds ultra._core (and the `ultra` command, for `python -m ultra`) with the project's CMake.

The repository root is this folder's parent. Configure options: the environment's CMAKE_ARGS (e.g.
"-DULTRA_CUDA=OFF"); CUDA is used when the build finds it, as for the command. The interpreter is the one
running pip (Python3_EXECUTABLE), whatever python3 is on PATH. Parallel jobs: CMAKE_BUILD_PARALLEL_LEVEL
(default: the CPUs).
"""

import os
import pathlib
import shlex
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = pathlib.Path(__file__).resolve().parent.parent


class CMakeExtension(Extension):
    def __init__(self, name: str):
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    def build_extension(self, ext: Extension) -> None:
        if not (ROOT / "CMakeLists.txt").is_file() or not (ROOT / "include" / "ultra").is_dir():
            raise RuntimeError(f"{ROOT}: not the ultra repository (build from a clone: pip install ./python)")
        out = pathlib.Path(self.get_ext_fullpath(ext.name)).resolve()
        build = pathlib.Path(self.build_temp).resolve() / "cmake"
        cfg = ["cmake", "-S", str(ROOT), "-B", str(build), f"-DPython3_EXECUTABLE={sys.executable}",
               "-DULTRA_PYTHON=ON", "-DULTRA_TESTS=OFF", "-DULTRA_BENCH=OFF", "-DCMAKE_BUILD_TYPE=Release"]
        if shutil.which("ninja") and not (build / "CMakeCache.txt").exists():
            cfg += ["-G", "Ninja"]
        cfg += shlex.split(os.environ.get("CMAKE_ARGS", ""))
        subprocess.check_call(cfg)
        jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 1))
        subprocess.check_call(["cmake", "--build", str(build), "-j", jobs, "--target", "ultra_python", "ultra"])
        built = build / "python" / "ultra"
        (core,) = built.glob("_core*.so")
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(core, out)
        (out.parent / "bin").mkdir(exist_ok=True)
        shutil.copy2(build / "ultra", out.parent / "bin" / "ultra")  # python -m ultra runs it


setup(ext_modules=[CMakeExtension("ultra._core")], cmdclass={"build_ext": CMakeBuild})
