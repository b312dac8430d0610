"""``python -m holdwarden.localcluster``: find or build the control plane's binaries."""

import sys

from holdwarden.localcluster.binaries import main

sys.exit(main())
