import sys

from h5stream.cli import main

sys.exit(main())
