"""DTensor's public API wherever this torch keeps it: torch.distributed.tensor (2.5 and later)
or torch.distributed._tensor (2.4); import it inside a scenario (it imports torch).

Thread-safety: import-time only.
"""

try:  # torch >= 2.5
    from torch.distributed.tensor import (DTensor, Replicate, Shard,  # noqa: F401
                                          distribute_module)
    from torch.distributed.tensor._utils import (  # noqa: F401
        compute_local_shape_and_global_offset)
except ImportError:  # torch 2.4
    from torch.distributed._tensor import (DTensor, Replicate, Shard,  # noqa: F401
                                           distribute_module)
    from torch.distributed._tensor._utils import (  # noqa: F401
        compute_local_shape_and_global_offset)
