import sys

from gpuctl.workloads.accept_suite.suite import main

sys.exit(main())
