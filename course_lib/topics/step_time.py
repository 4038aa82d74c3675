"""A training step's time under a parallel recipe, on a stated cluster (a model), and the search
for the recipes that fit and the fastest of them (lesson 21).

    compute          (6, or 8 with checkpointing's second forward) * N * tokens / GPUs / (peak * MFU)
    pipeline bubble  compute * (p - 1) / m: the step is m + p - 1 slots of which m compute (lesson 18)
    tensor parallel  4 all-reduces per layer and micro-batch (2 forward, 2 backward; 6 with
                     checkpointing) of s * b * h bf16 values, over the t ranks' link
    data parallel    a ring all-reduce of the bf16 gradients over the dp ranks (ZeRO 1-2: its two
                     halves, the same bytes); ZeRO-3 gathers the parameters too: 1.5 times
    offload          bf16 gradients to the CPU and bf16 weights back, of this GPU's shard, over PCIe

The ranks are placed tensor-parallel innermost, then data-parallel, then pipeline stages (Megatron-
LM's order): a group of consecutive ranks that fits in a node talks over the node's links, else over
the network. Nothing overlaps in the model (DDP hides much of its all-reduce behind backward, lesson
15); the pipeline's sends, the optimizer step and the kernels' launch are left out.
"""
import itertools
from dataclasses import dataclass

from .cost_model import ring_all_reduce_time
from .planning import ParallelRecipe, TransformerShape, parameters_per_gpu, plan_memory

STEP_PARTS = ("compute", "pipeline bubble", "tensor parallel", "data parallel", "offload")


@dataclass(frozen=True)
class Cluster:
    nodes: int
    gpus_per_node: int
    gpu_memory_bytes: int
    peak_flops: float          # per GPU, bf16 dense
    mfu: float                 # the share of the peak a step reaches (an assumption)
    intra_node_busbw: float    # bytes/s, an all-reduce's bus bandwidth inside a node
    inter_node_busbw: float    # bytes/s, between nodes
    host_bandwidth: float      # bytes/s, GPU <-> CPU memory (offload)
    latency: float = 10e-6     # seconds, alpha of each ring step

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node


# The lesson's cluster, a model: two nodes of four 48 GB PCIe cards, NVIDIA L40S (its datasheet:
# 48 GB GDDR6, 362 TFLOP/s bf16 dense, PCIe Gen4 x16 at 64 GB/s both ways together, no NVLink),
# 47.4 GB of each left for tensors. Assumed, not measured: 40% MFU; an all-reduce's bus bandwidth
# of 20 GB/s between a node's cards over PCIe and 10 GB/s between nodes (a 100 Gb/s NIC a node);
# 25 GB/s to CPU memory. Compare the 466-482 GB/s of an 8-H200 NVLink node (cost_model.PUBLISHED_ALL_REDUCE).
STATED_CLUSTER = Cluster(nodes=2, gpus_per_node=4, gpu_memory_bytes=int(47.4e9), peak_flops=362e12,
                         mfu=0.40, intra_node_busbw=20e9, inter_node_busbw=10e9, host_bandwidth=25e9)


def group_bandwidth(consecutive_ranks: int, cluster: Cluster) -> float:
    """The bus bandwidth of a group of this many consecutive ranks: inside one node, or not."""
    inside = consecutive_ranks <= cluster.gpus_per_node
    return cluster.intra_node_busbw if inside else cluster.inter_node_busbw


def step_seconds(shape: TransformerShape, recipe: ParallelRecipe, cluster: Cluster,
                 global_batch: int, micro_batch: int = 1) -> dict:
    """{part: seconds} of one optimizer step of `global_batch` sequences (see STEP_PARTS)."""
    microbatches = global_batch // (recipe.dp * micro_batch)
    tokens = global_batch * shape.seq_len
    flops = (8 if recipe.checkpointing else 6) * shape.parameters * tokens / cluster.world_size
    compute = flops / (cluster.peak_flops * cluster.mfu)
    parts = dict.fromkeys(STEP_PARTS, 0.0)
    parts["compute"] = compute
    parts["pipeline bubble"] = compute * (recipe.pp - 1) / microbatches
    if recipe.tp > 1:
        message = shape.seq_len * micro_batch * shape.hidden * 2
        count = (6 if recipe.checkpointing else 4) * shape.layers // recipe.pp * microbatches
        beta = 1 / group_bandwidth(recipe.tp, cluster)
        parts["tensor parallel"] = count * ring_all_reduce_time(message, recipe.tp, cluster.latency, beta)
    gradients = 2 * parameters_per_gpu(shape, recipe)
    if recipe.dp > 1:
        beta = 1 / group_bandwidth(recipe.tp * recipe.dp, cluster)
        times = 1.5 if recipe.zero == 3 else 1.0
        parts["data parallel"] = times * ring_all_reduce_time(gradients, recipe.dp, cluster.latency, beta)
    if recipe.offload:
        shard = gradients // (recipe.dp if recipe.zero >= 1 else 1)
        parts["offload"] = 2 * shard / cluster.host_bandwidth
    return parts


def candidate_recipes(shape: TransformerShape, world_size: int) -> list:
    """Every recipe with dp * tp * pp = world_size, t dividing the heads, p dividing the layers;
    ZeRO's stages only where there are dp ranks to shard over."""
    recipes = []
    for tp in range(1, world_size + 1):
        for pp in range(1, world_size // tp + 1):
            if world_size % (tp * pp) or shape.heads % tp or shape.layers % pp:
                continue
            dp = world_size // (tp * pp)
            for zero, checkpointing, offload in itertools.product(range(4) if dp > 1 else (0,),
                                                                  (False, True), (False, True)):
                recipes.append(ParallelRecipe(dp, tp, pp, zero, checkpointing, offload))
    return recipes


def search(shape: TransformerShape, cluster: Cluster, global_batch: int, micro_batch: int = 1) -> dict:
    """{recipe: predicted step seconds} for each candidate whose dp ranks split the batch into
    whole micro-batches and whose stage 0 fits in the GPU; fastest first."""
    fitting = {}
    for recipe in candidate_recipes(shape, cluster.world_size):
        if global_batch % (recipe.dp * micro_batch):
            continue
        microbatches = global_batch // (recipe.dp * micro_batch)
        if plan_memory(shape, recipe, micro_batch, microbatches).fits(cluster.gpu_memory_bytes):
            fitting[recipe] = sum(step_seconds(shape, recipe, cluster, global_batch, micro_batch).values())
    return dict(sorted(fitting.items(), key=lambda item: item[1]))
