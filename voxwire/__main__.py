import sys

from voxwire.cli import main

sys.exit(main())
