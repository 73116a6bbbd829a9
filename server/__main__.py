import sys

from voxwire.server.cli import main

sys.exit(main())
