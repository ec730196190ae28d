"""`torchrun --nproc-per-node N -m pivot_envs.adapters.grpo [pivotrl train's flags]`: the bundled trainer data-parallel.

One process without torchrun, as `pivotrl train`; see `grpo.distributed`.
"""

import sys

from pivot_envs.adapters.grpo.distributed import main

sys.exit(main())
