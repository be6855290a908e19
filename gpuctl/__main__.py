import sys

from gpuctl.cli.main import main

sys.exit(main())
