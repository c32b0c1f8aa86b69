"""``python -m kina_fx ...``: the ``kina-fx`` command."""
import sys

from .cli import main

sys.exit(main())
