import sys

from falsify.cli import main

sys.exit(main())
