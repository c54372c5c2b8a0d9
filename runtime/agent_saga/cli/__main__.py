"""``python -m agent_saga.cli``: the ``agent-saga`` command."""

import sys

from . import main

sys.exit(main())
