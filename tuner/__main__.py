"""``python -m tuner``: the ``tuner`` command."""

import sys

from tuner.commands.main import main

sys.exit(main())
