"""`python -m ix_device_plugin` runs the command line."""

import sys

from ix_device_plugin.entry import main

sys.exit(main())
