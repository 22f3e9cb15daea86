"""``python -m blackbox_spec.cli``: the same as ``bspec``."""

import sys

from . import main

sys.exit(main())
