import sys

from sia_grpc.slurm.bridge import main

sys.exit(main())
