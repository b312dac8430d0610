"""``python -m rig.localcluster``: find or build the control plane's binaries."""

import sys

from rig.localcluster.binaries import main

sys.exit(main())
