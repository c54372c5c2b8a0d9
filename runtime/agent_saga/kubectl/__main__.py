"""``python -m agent_saga.kubectl`` runs ``kubectl saga``."""

import sys

from . import main

sys.exit(main())
