"""`labkit.metrics` is the stable public name of `labkit.core.metrics`, where the code lives (this module
is that module: every name, public or not, is the same object)."""

import sys

from labkit.core import metrics as _module

sys.modules[__name__] = _module
