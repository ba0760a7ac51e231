"""HSDP: shard each model within a node and replicate it across nodes (FSDP2 on a 2-D device mesh).

Plain FSDP shards over every rank, so each layer's all-gather and reduce-scatter cross the slow network between
nodes. HSDP keeps them inside a node (over NVLink or shared memory) and only all-reduces the already
reduce-scattered gradient shards across nodes, once per step.
"""
import logging

from torchstage.distributed.layout import complete, node_size
from torchstage.strategies.fsdp import FSDP

logger = logging.getLogger("torchstage")


class HSDP(FSDP):
    """``strategy="hsdp"``: FSDP's options, its layout from the world by default: each node's ranks shard the model
    (``shard`` = the processes on a node), the nodes replicate it (``replicate`` = the nodes).

    ``HSDP(replicate=R, shard=S)`` chooses the layout, as ``FSDP(replicate=R, shard=S)`` does; ``R x S`` must be the
    world size. On one node the default layout is plain FSDP over that node's ranks.
    """

    name = "hsdp"

    def layout(self, world):
        """``nodes x ranks per node`` unless given; on one process, said to be dropped."""
        if world.world_size == 1:
            logger.warning("%s on one process: HSDP is dropped. HSDP shards the model within each node and "
                           "replicates it across nodes, and one process has no other rank to shard or replicate "
                           "with: this run trains as on a single device (its checkpoints are still sharded "
                           "directories). To use it, start several processes (train(..., distributed=True, "
                           "nprocs=N), torchrun or srun)",
                           self.mesh_label() if self.replicate or self.shard else f"strategy={self.name!r}")
        per_node = node_size(world)
        if per_node is None and self.replicate is None and self.shard is None:
            raise ValueError(f"{self.mesh_label()}: the launcher of these {world.world_size} processes does not say "
                             f"how many run on each node, which the default layout shards over; give the layout, "
                             f"HSDP(shard=<processes per node>)")
        return complete(self.mesh_label(), world.world_size, self.replicate, self.shard, per_node)
