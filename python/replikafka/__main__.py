import sys

from replikafka.cli.main import main

sys.exit(main())
