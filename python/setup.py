"""Builds the dlrec wheel around the libdlrec.so that `make` built: the
package is pure Python over the library (cffi in ABI mode, so nothing is
compiled here), and the library and its API header (include/dlrec.h,
whose declarations the binding reads) go into the package.

The library is looked for in $DLREC_LIBRARY, else ../build/libdlrec.so (the
repository's release build), and the header in $DLREC_API_HEADER, else
../include/dlrec.h. The wheel is tagged for this platform."""
import os
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = os.path.dirname(os.path.abspath(__file__))


def library():
    path = os.environ.get("DLREC_LIBRARY") or os.path.join(HERE, "..", "build", "libdlrec.so")
    if not os.path.exists(path):
        raise SystemExit(f"dlrec: no libdlrec.so at {path}: run `make` in the repository first "
                         "(or set DLREC_LIBRARY to the library)")
    return path


def header():
    path = os.environ.get("DLREC_API_HEADER") or os.path.join(HERE, "..", "include", "dlrec.h")
    if not os.path.exists(path):
        raise SystemExit(f"dlrec: no dlrec.h at {path} (set DLREC_API_HEADER to include/dlrec.h)")
    return path


class BuildWithLibrary(build_py):
    def run(self):
        super().run()
        dest = os.path.join(self.build_lib, "dlrec")
        os.makedirs(dest, exist_ok=True)
        shutil.copy2(library(), os.path.join(dest, "libdlrec.so"))
        # The API's declarations, which the binding reads (dlrec/_lib.py).
        shutil.copy2(header(), os.path.join(dest, "dlrec.h"))


class BinaryDistribution(Distribution):
    def has_ext_modules(self):
        return True


setup(cmdclass={"build_py": BuildWithLibrary}, distclass=BinaryDistribution)
