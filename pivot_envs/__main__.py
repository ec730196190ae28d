import sys

from pivot_envs.cli import main

sys.exit(main())
