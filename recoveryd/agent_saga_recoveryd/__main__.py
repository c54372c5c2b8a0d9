"""``python -m agent_saga_recoveryd``: the same as the ``agent-saga-recoveryd`` script."""

import sys

from .app import main

sys.exit(main())
