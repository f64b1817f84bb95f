# The native module built from _copycrc.c (absent where it could not be built: see copy_digest).
import numpy as np

def copy_crc32c(dest: memoryview, source: memoryview | np.ndarray, value: int = 0, /) -> int: ...
