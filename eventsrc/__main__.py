import sys

from eventsrc.cli.main import main

sys.exit(main())
