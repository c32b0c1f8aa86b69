"""The old home of :mod:`kina_fx.autograd.memory` (tapes over memory), kept so
that ``import kina_fx.memory_tape`` keeps working: it is the same module object."""
import sys

from .autograd import memory as _memory

sys.modules[__name__] = _memory
