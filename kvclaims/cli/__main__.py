"""``python -m kvclaims.cli``: the same as the ``kvclaims`` command."""

import sys

from kvclaims.cli import main

sys.exit(main())
