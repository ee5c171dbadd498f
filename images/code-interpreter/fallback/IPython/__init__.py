"""What a notebook cell may import from IPython, for a kernel that is not IPython: forkpoint's
(kernel.py) puts this directory last on its path, so an IPython the sandbox installs wins."""
from . import display  # noqa: F401 (IPython.display, as the real package has it)

# Libraries that find IPython imported ask for its version (matplotlib: below 8.24 it reaches
# into IPython's GUI integration); this answers as an IPython with none, whose shell is not
# running (get_ipython() is None).
version_info = (8, 24, 0, "")


def get_ipython():
    return None
