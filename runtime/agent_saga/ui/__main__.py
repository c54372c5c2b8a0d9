"""``python -m agent_saga.ui --wal-path ./agent-saga.wal``: the same as ``agent-saga ui``."""

import sys

from .command import main

sys.exit(main())
