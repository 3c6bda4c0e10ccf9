import sys

from sia_grpc.slurm.cli import main

sys.exit(main())
