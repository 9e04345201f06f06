"""`labkit.config` is the stable public name of `labkit.core.config`, where the code lives (this module
is that module: every name, public or not, is the same object)."""

import sys

from labkit.core import config as _module

sys.modules[__name__] = _module
