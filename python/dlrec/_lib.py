"""The cffi binding of libdlrec's host API (include/dlrec.h), in ABI
mode: the declarations are read from that header, installed beside this
file with the library libdlrec.so (or $DLREC_LIBRARY)."""
import os
import re

from cffi import FFI

HERE = os.path.dirname(os.path.abspath(__file__))


def _declarations(path):
    """dlrec.h as cffi's cdef takes it: its preprocessor lines and C++ guards
    dropped (the header is flat C declarations otherwise), and its
    DLREC_API_VERSION."""
    with open(path) as f:
        text = f.read()
    version = int(re.search(r"#define DLREC_API_VERSION (\d+)", text).group(1))
    keep = [line for line in text.splitlines()
            if not line.lstrip().startswith("#") and line.strip() not in ('extern "C" {', "}")]
    return "\n".join(keep), version


CDEF, API_VERSION = _declarations(os.path.join(HERE, "dlrec.h"))
# A stream is five pointers (the Arrow C stream interface, an ABI): the
# binding allocates them as bytes and hands their address to pyarrow.
ARROW_STREAM_BYTES = 5 * FFI().sizeof("void *")

ffi = FFI()
ffi.cdef(CDEF)


def _load():
    path = os.environ.get("DLREC_LIBRARY") or os.path.join(os.path.dirname(os.path.abspath(__file__)), "libdlrec.so")
    lib = ffi.dlopen(path)
    if lib.dlrec_api_version() != API_VERSION:
        raise ImportError(f"dlrec: {path} has API version {lib.dlrec_api_version()}, this package wants {API_VERSION}")
    return lib


lib = _load()
