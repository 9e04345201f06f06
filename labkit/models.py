"""`labkit.models` is the stable public name of `labkit.core.models`, where the code lives (this module
is that module: every name, public or not, is the same object)."""

import sys

from labkit.core import models as _module

sys.modules[__name__] = _module
