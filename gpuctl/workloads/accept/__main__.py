import sys

from gpuctl.workloads.accept.suite import main

sys.exit(main())
