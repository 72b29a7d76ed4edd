"""The device mesh: data parallel over all devices, optionally FSDP for parameters.

The mesh has axes ("data", "fsdp"). Every batch is split over both; with fsdp > 1 each
parameter (and its optimiser state) is also split along its largest dimension that the fsdp
axis divides, and XLA gathers it where it is used. On one device all of this is a no-op.
"""

from __future__ import annotations

from typing import Any

import jax
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P


def make_mesh(fsdp: int = 1) -> Mesh:
    devices = jax.device_count()
    if fsdp < 1 or devices % fsdp:
        raise ValueError(f"train.fsdp={fsdp} must be a positive divisor of the {devices} devices")
    # Auto axes: jit propagates shardings from the inputs; the model needs no annotations.
    return jax.make_mesh((devices // fsdp, fsdp), ("data", "fsdp"),
                         axis_types=(AxisType.Auto, AxisType.Auto))


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """Rows of a batch split over every device."""
    return NamedSharding(mesh, P(("data", "fsdp")))


def state_shardings(state: Any, mesh: Mesh) -> Any:
    """Replicated leaves, or with fsdp > 1 each leaf split along its largest divisible axis."""
    fsdp = mesh.shape["fsdp"]

    def sharding(leaf) -> NamedSharding:
        shape = getattr(leaf, "shape", ())
        if fsdp > 1:
            for axis in sorted(range(len(shape)), key=lambda a: -shape[a]):
                if shape[axis] % fsdp == 0:
                    spec = [None] * len(shape)
                    spec[axis] = "fsdp"
                    return NamedSharding(mesh, P(*spec))
        return NamedSharding(mesh, P())

    return jax.tree.map(sharding, state)
